"""Workers: the live ones (presence keys, via ops.status.gather) grouped by host, and the gone
ones: worker ids that stored pages in the last hour but have no presence key now."""

from __future__ import annotations

import time
from typing import Any

import redis

from ops.dashboard.connections import Connections
from ops.dashboard.data import iso
from ops.dashboard.text import whole
from shared.redis.presence import PRESENCE_TTL_S, live_workers

GONE_WINDOW = "1 hour"
RECENT_WORKERS = f"""
SELECT worker_id, max(fetched_at), count(*) FROM pages
WHERE fetched_at > now() - interval '{GONE_WINDOW}' GROUP BY worker_id ORDER BY max(fetched_at) DESC LIMIT 200
"""


def by_host(live: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    now = time.time()
    hosts: dict[str, list[dict[str, Any]]] = {}
    for worker in live:
        started = worker.get("started_at")
        uptime = now - started if isinstance(started, int | float) else None
        pages = int(worker.get("pages_in_window", 0))
        hosts.setdefault(str(worker.get("host", "?")), []).append(
            {**worker, "uptime_s": uptime, "pages_per_s": round(pages / 60, 2)}
        )
    return dict(sorted(hosts.items()))


def running(links: Connections) -> list[dict[str, Any]] | None:
    """The presence records under the configured prefix; None when Redis cannot be asked."""
    try:
        return live_workers(links.redis, links.settings.redis_prefix)
    except redis.RedisError:
        return None


def gone(links: Connections, live_ids: set[str]) -> list[dict[str, Any]]:
    with links.db() as conn:
        exists = conn.execute("SELECT to_regclass('pages') IS NOT NULL").fetchone()
        if not (exists and exists[0]):
            return []
        rows = conn.execute(RECENT_WORKERS).fetchall()
    return [
        {"worker_id": str(w), "last_page_at": iso(at), "pages": whole(n)}
        for w, at, n in rows
        if str(w) not in live_ids and str(w) != "runs"
    ]


__all__ = ["PRESENCE_TTL_S", "by_host", "gone"]
