"""A local site of pages that scripts build, on a loopback address of its own, and a canary: a
listener on another loopback address that counts every connection made to it. The renderer's
tests (tests/renderer), its soak (bench/render_soak.py) and its benchmark (bench/render_bench.py)
use it."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SITE_HOST, CANARY_HOST = "127.0.0.5", "127.0.0.6"  # the tests allow the first, never the second

PAGES = {
    "/content": """<div id="root"></div><script>
document.getElementById('root').innerHTML = '<h1>Built</h1><p>content inserted by a script</p>';
</script>""",
    "/links": """<div id="app"></div><script>
const app = document.getElementById('app');
for (const name of ['content', 'popup']) {
  const a = document.createElement('a'); a.href = '/' + name; a.textContent = name; app.appendChild(a);
}
</script>""",
    "/unsettled": """<div id="root">never settles</div><script>
setInterval(() => fetch('/tick?' + Math.random()).catch(() => {}), 100);
</script>""",
    "/popup": """<div id="root">opens a popup</div><script>
window.open('/content'); window.open('/content', '_blank');
</script>""",
    "/memory": """<div id="root">allocates</div><script>
const kept = []; for (;;) { kept.push(new Array(1e6).fill(Math.random())); }
</script>""",
    "/away": """<div id="root">leaving</div><script>
setTimeout(() => { location.href = '/content'; }, 50);
</script>""",
    # Its load event waits for an image the site never finishes sending: render_timeout.
    "/never-loads": """<div id="root">waits for an image</div><img src="/hang.png">""",
    "/dialog": """<div id="root">asks questions</div><script>
alert('hello'); const sure = confirm('sure?'); prompt('name?');
document.getElementById('root').textContent = 'dialogs dismissed: ' + (sure ? 'accepted' : 'declined');
</script>""",
    "/plain": "<h1>Plain</h1><p>" + "A page a worker stores as it comes, no script needed. " * 20 + "</p>",
    "/hostile": """<div id="root">hostile</div>
<iframe src="http://CANARY/frame"></iframe><img src="http://CANARY/image.png">
<script>
fetch('http://CANARY/xhr').catch(() => {});
const x = new XMLHttpRequest(); x.open('GET', 'http://CANARY/xhr2'); x.send();
try { new WebSocket('ws://CANARY/socket'); } catch (e) {}
setTimeout(() => { location.href = 'http://CANARY/away'; }, 200);
</script>""",
}


BENCH_CYCLE = ("/content", "/links", "/popup", "/away")
# A site whose links only scripts build, for discovery: /spa/<n> links to /spa/<2n+1> and
# /spa/<2n+2> while they are under SPA_PAGES, so a crawl from /spa/0 that follows the rendered
# links reaches every page, and one that reads the shells reaches only the first.
SPA_PAGES = 7
SPA_PAGE = """<div id="root"></div><script>
const root = document.getElementById('root');
root.innerHTML = '<h1>Page __N__</h1><p>built by a script, page __N__ of the app</p>';
for (const child of [2 * __N__ + 1, 2 * __N__ + 2].filter((k) => k < __LIMIT__)) {
  const a = document.createElement('a'); a.href = '/spa/' + child; a.textContent = 'page ' + child;
  root.appendChild(a);
}
</script>"""


def spa_paths() -> tuple[str, ...]:
    return tuple(f"/spa/{n}" for n in range(SPA_PAGES))


class ScriptHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: the site counts requests itself."""

    def send(self, status: int, content_type: str, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True

    def do_GET(self) -> None:
        site: ScriptSite = self.server.site
        path = self.path.split("?", 1)[0]
        site.requests.append(path)
        if path == "/robots.txt":
            self.send(200, "text/plain", b"User-agent: *\nAllow: /\n")
        elif path == "/sitemap.xml":
            urls = "".join(f"<url><loc>{site.url(p)}</loc></url>" for p in site.sitemap_paths)
            body = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
            self.send(200, "application/xml", body.encode())
        elif path == "/tick":
            self.send(200, "text/plain", b"tick")
        elif path == "/hang.png":  # headers, then nothing until the site closes
            self.hang(site)
        elif path == "/download":
            self.send_download()
        elif path.startswith("/spa/") and path[5:].isdigit() and int(path[5:]) < SPA_PAGES:
            script = SPA_PAGE.replace("__N__", path[5:]).replace("__LIMIT__", str(SPA_PAGES))
            self.send(200, "text/html; charset=utf-8", shell(f"spa {path[5:]}", script))
        elif path.startswith("/p/") and path[3:].isdigit():  # many pages, for the benchmark
            self.page(BENCH_CYCLE[int(path[3:]) % len(BENCH_CYCLE)], site)
        elif path in PAGES:
            self.page(path, site)
        else:
            self.send(404, "text/plain", b"no such page")

    def page(self, path: str, site: ScriptSite) -> None:
        script = PAGES[path].replace("CANARY", site.canary_address)
        self.send(200, "text/html; charset=utf-8", shell(path[1:], script))

    def hang(self, site: ScriptSite) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.flush()
        except OSError:
            return
        site.closing.wait()
        self.close_connection = True

    def send_download(self) -> None:
        body = b"a file, not a page" * 100
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Disposition", 'attachment; filename="report.bin"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True


def shell(title: str, script: str) -> bytes:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{script}</body></html>".encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    site: ScriptSite

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that hangs up is not an error here."""


class Canary:
    """Accepts and counts connections on CANARY_HOST; answers nothing."""

    def __init__(self) -> None:
        self._socket = socket.create_server((CANARY_HOST, 0))
        self.port = self._socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._socket.close()


class ScriptSite:
    def __init__(self, canary: Canary, sitemap_paths: tuple[str, ...] = ()) -> None:
        self.canary_address = f"{CANARY_HOST}:{canary.port}"
        self.sitemap_paths = sitemap_paths
        self.requests: list[str] = []
        self.closing = threading.Event()  # lets go of the answers that hang (/hang.png)
        self._server = _Server((SITE_HOST, 0), ScriptHandler)
        self._server.site = self
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://{SITE_HOST}:{self.port}{path}"

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
