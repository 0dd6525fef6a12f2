"""The run page's panels beyond the accounting, each built from what ops.status already gathers
or from what the services record, the same way ops.status reads the rest (pure functions of
gather()'s report and the run's counters, so the unit tests give them plain dicts):

- proxies: each proxy's health, usable or benched (`proxies` of gather: shared proxy-bench and
  proxy-failures keys);
- politeness: the jitter between requests and the domains slowed down now (`politeness` of
  gather: the adaptive slow-down's keys);
- renders: what the renderers did for the run, from the run's counters in Redis (`renders.<outcome>`
  and `render_ms` counted by each render; `sent_to_render.<reason>` by the workers under
  RENDER=auto; `enqueued.render` by the producer's routing rules), its dead letters of reasons
  `render_*`, the depth of `<ns>.render`, and the browser restarts the renderers' presence
  records carry (`browser_restarts`, when a renderer reports it);
- discovery: whether the run's total is still growing (a discovery run with links waiting for
  the frontier, or URLs left whose pages may add more).
"""

from __future__ import annotations

from typing import Any

from shared.amqp.topology import discovery_queue, render_queue

# The fields the renderer counts (renderer/figures.py, which ops may not import: the unit tests
# check the names agree) and the worker's (worker/handling/render_figures.py).
RENDERS_PREFIX = "renders."  # renders.<outcome>
RENDER_MS = "render_ms"
SENT_TO_RENDER = "sent_to_render."  # worker/handling/render_figures.py
DONE_OUTCOMES = ("ok", "unsettled")  # a page was read: settled, or as it stood at the deadline
TIMEOUT, REFUSED, CRASHED = "render_timeout", "render_refused", "render_crashed"
RESTARTS_FIELD = "browser_restarts"  # in a renderer's presence record


def proxies_panel(proxies: list[dict[str, Any]] | dict[str, str] | None) -> dict[str, Any] | None:
    """None when no proxy is configured (or Redis could not be asked: the header says so)."""
    if isinstance(proxies, dict):
        return {"error": proxies.get("error", "?"), "rows": [], "usable": 0, "total": 0}
    if not proxies:
        return None
    rows = [
        {
            "proxy": p["proxy"],
            "ok": p["state"] == "usable",
            "state": "ok" if p["state"] == "usable" else "failing",
            "benched_s": p.get("benched_s", 0.0),
            "recent_failures": p.get("recent_failures", 0),
        }
        for p in proxies
    ]
    return {"error": None, "rows": rows, "usable": sum(r["ok"] for r in rows), "total": len(rows)}


def politeness_panel(politeness: dict[str, Any] | None) -> dict[str, Any] | None:
    if politeness is None:
        return None
    slowed = list(politeness.get("slowed_domains", []))
    total = int(politeness.get("slowed_total", len(slowed)))
    return {
        "jitter": float(politeness.get("rate_jitter", 0.0)),
        "slowed": slowed,
        "slowed_total": total,
        "more": max(0, total - len(slowed)),
    }


def render_panel(
    counters: dict[str, Any],
    dead_letters: dict[str, int],
    queues: list[dict[str, Any]],
    namespace: str,
    workers: list[dict[str, Any]] | None,
) -> dict[str, Any] | None:
    """None when the run has nothing to do with rendering and the render queue is empty."""
    outcomes = _fields(counters, RENDERS_PREFIX)
    sent = _fields(counters, SENT_TO_RENDER)
    routed = _count(counters.get("enqueued.render", 0))
    queue = next((q for q in queues if q["name"] == render_queue(namespace) and q["exists"]), None)
    depth = None if queue is None else {"ready": queue["ready"], "unacked": queue["unacked"]}
    renderers = [w for w in workers or [] if RESTARTS_FIELD in w]
    render_dead = {r: n for r, n in dead_letters.items() if r.startswith("render_")}
    waiting = bool(depth and ((depth["ready"] or 0) + (depth["unacked"] or 0)))
    if not (outcomes or sent or routed or render_dead or waiting):
        return None
    made = sum(outcomes.values())
    done = sum(outcomes.get(k, 0) for k in DONE_OUTCOMES)
    return {
        "renders": made,
        "done": done,
        "unsettled": outcomes.get("unsettled", 0),
        "failed": made - done,
        "timeouts": outcomes.get(TIMEOUT, 0),
        "refused": outcomes.get(REFUSED, 0),
        "crashed": outcomes.get(CRASHED, 0),
        "outcomes": dict(sorted(outcomes.items(), key=lambda item: (-item[1], item[0]))),
        "mean_ms": round(_count(counters.get(RENDER_MS, 0)) / made) if made else None,
        "sent": {"routing rule": routed, **{f"auto: {k}": n for k, n in sorted(sent.items())}},
        "dead": render_dead,
        "queue": render_queue(namespace),
        "depth": depth,
        # Restarts are the renderers' own (one browser each), not the run's: the live ones' sum.
        "browser_restarts": sum(_count(w[RESTARTS_FIELD]) for w in renderers) if renderers else None,
        "renderers_reporting": len(renderers),
    }


def still_growing(
    discovery: bool, state: str, left: int, queues: list[dict[str, Any]], namespace: str
) -> bool:
    """A discovery run's total grows while links wait for the frontier, and while URLs are left
    whose pages may bring more; a cancelled run follows no more links."""
    if not discovery or state == "cancelled":
        return False
    waiting = sum(
        (q["ready"] or 0) + (q["unacked"] or 0)
        for q in queues
        if q["name"] == discovery_queue(namespace) and q["exists"]
    )
    return waiting > 0 or left > 0


def _fields(counters: dict[str, Any], prefix: str) -> dict[str, int]:
    return {k[len(prefix) :]: _count(v) for k, v in counters.items() if k.startswith(prefix)}


def _count(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
