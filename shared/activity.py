"""What the pipeline has been doing lately, read from PostgreSQL: the live half of the status view.

Rates come from `pages.fetched_at`, the time each page was committed, so they count stored
pages (not fetches) from every worker, wherever it runs. "Now" is the database's clock, the
same clock that stamped the rows, so the figures do not depend on the clock of the machine
asking. A worker counts as seen when it stored a page recently: an idle or stuck worker drops
out of the list, which is the point of showing it.
"""

from __future__ import annotations

from typing import Any

import psycopg

RATE_WINDOW_S = 60
WORKER_SEEN_S = 120
TOP_DOMAINS = 5

# %(run_id)s NULL means every run.
RUN_FILTER = "(%(run_id)s::text IS NULL OR run_id = %(run_id)s)"
PAGES_SINCE = f"""
SELECT count(*) FROM pages
WHERE fetched_at > now() - make_interval(secs => %(window_s)s) AND {RUN_FILTER}
"""
# The host of the URL: after the scheme, without any user info or port.
DOMAINS_SINCE = f"""
SELECT substring(url from '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?([^/:?#]+)') AS domain, count(*)
FROM pages
WHERE fetched_at > now() - make_interval(secs => %(window_s)s) AND {RUN_FILTER}
GROUP BY domain ORDER BY count(*) DESC, domain LIMIT %(limit)s
"""
WORKERS_SINCE = f"""
SELECT worker_id, count(*), max(fetched_at) FROM pages
WHERE fetched_at > now() - make_interval(secs => %(window_s)s) AND {RUN_FILTER}
GROUP BY worker_id ORDER BY count(*) DESC, worker_id
"""
DEAD_BY_REASON = f"""
SELECT reason, count(*) FROM dead_letters WHERE state = 'dead' AND {RUN_FILTER}
GROUP BY reason ORDER BY reason
"""


def recent_activity(conn: psycopg.Connection[Any], run_id: str | None) -> dict[str, Any]:
    """Pages per second over the last RATE_WINDOW_S, its busiest domains, the workers seen in
    the last WORKER_SEEN_S, and the dead letters by reason (of `run_id`, or of every run)."""
    window = {"run_id": run_id, "window_s": RATE_WINDOW_S}
    row = conn.execute(PAGES_SINCE, window).fetchone()
    pages = int(row[0]) if row else 0
    domains = conn.execute(DOMAINS_SINCE, {**window, "limit": TOP_DOMAINS}).fetchall()
    workers = conn.execute(WORKERS_SINCE, {"run_id": run_id, "window_s": WORKER_SEEN_S}).fetchall()
    dead = conn.execute(DEAD_BY_REASON, {"run_id": run_id}).fetchall()
    return {
        "window_s": RATE_WINDOW_S,
        "pages_in_window": pages,
        "pages_per_s": round(pages / RATE_WINDOW_S, 3),
        "top_domains": [{"domain": d or "", "pages": int(n)} for d, n in domains],
        "workers_seen_s": WORKER_SEEN_S,
        "workers": [
            {"worker_id": w, "pages": int(n), "last_page_at": last.isoformat()} for w, n, last in workers
        ],
        "dead_letters": {str(reason): int(n) for reason, n in dead},
    }


def render_activity(activity: dict[str, Any]) -> list[str]:
    window_s, seen_s = activity["window_s"], activity["workers_seen_s"]
    domains = ", ".join(f"{d['domain']} {d['pages']}" for d in activity["top_domains"])
    dead = " ".join(f"{reason}={n}" for reason, n in activity["dead_letters"].items())
    lines = [
        f"activity (last {window_s} s)",
        f"  pages/s        {activity['pages_per_s']:.2f}  ({activity['pages_in_window']} pages)",
        f"  top domains    {domains or '(none)'}",
        f"  dead letters   {dead or 0}",
        f"  workers seen in the last {seen_s} s: {len(activity['workers']) or 'none'}",
    ]
    lines += [
        f"    {w['worker_id']}  {w['pages']} pages, last at {w['last_page_at']}" for w in activity["workers"]
    ]
    return lines
