// Live regions over Server-Sent Events, a "updated N s ago" clock, and confirm prompts.
// Every page works without this file: it only replaces regions the server rendered.
(function () {
  "use strict";
  var body = document.body, url = body.getAttribute("data-stream");
  var status = document.getElementById("live-status");
  var meta = document.querySelector('meta[name="csrf-token"]');
  var csrf = meta ? meta.getAttribute("content") : "";
  var source = null, lastAt = 0, interval = 2, retryMs = 1000;

  function show(state, text) { if (status) { status.setAttribute("data-state", state); status.textContent = text; } }

  function fillTokens(root) {
    root.querySelectorAll('input[name="csrf_token"]').forEach(function (input) { input.value = csrf; });
  }

  function apply(message) {
    var data = JSON.parse(message.data);
    interval = data.interval_s || interval;
    if (data.error) { show("stale", "reconnecting: " + data.error); return; }
    lastAt = Date.now();
    Object.keys(data.regions || {}).forEach(function (id) {
      var region = document.getElementById(id);
      if (!region) { return; }
      // Fragments the server rendered with autoescape: text from the web arrives escaped.
      var parsed = new DOMParser().parseFromString(data.regions[id], "text/html");
      region.replaceChildren.apply(region, Array.prototype.slice.call(parsed.body.childNodes));
      fillTokens(region);
    });
  }

  function connect() {
    if (!url || source) { return; }
    source = new EventSource(url);
    source.onmessage = function (message) { retryMs = 1000; apply(message); };
    source.onerror = function () {
      show("stale", "reconnecting");
      source.close(); source = null;
      window.setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden && source) { source.close(); source = null; show("paused", "paused (tab hidden)"); }
    else if (!document.hidden) { connect(); }
  });

  window.setInterval(function () {
    if (!source || !lastAt) { return; }
    var ago = Math.round((Date.now() - lastAt) / 1000);
    show(ago > 3 * interval ? "stale" : "on", "live, every " + interval + " s · updated " + ago + " s ago");
  }, 1000);

  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { event.preventDefault(); }
  });

  connect();
}());
