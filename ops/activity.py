"""What the pipeline has been doing lately, read from PostgreSQL: the live half of the status view.

Rates come from `pages.fetched_at`, the time each page was committed, so they count stored
pages (not fetches) from every worker, wherever it runs. "Now" is the database's clock, the
same clock that stamped the rows, so the figures do not depend on the clock of the machine
asking. Every figure here covers the same window, dead letters included (by the time they were
last recorded). Which workers are running is not read from here but from their presence keys
in Redis (shared/redis/presence.py): pages stored say nothing of an idle worker.
"""

from __future__ import annotations

from typing import Any

import psycopg

RATE_WINDOW_S = 60
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
SELECT worker_id, count(*) FROM pages
WHERE fetched_at > now() - make_interval(secs => %(window_s)s) AND {RUN_FILTER}
GROUP BY worker_id ORDER BY count(*) DESC, worker_id
"""
DEAD_BY_REASON_SINCE = f"""
SELECT reason, count(*) FROM dead_letters
WHERE state = 'dead' AND last_failed_at > now() - make_interval(secs => %(window_s)s) AND {RUN_FILTER}
GROUP BY reason ORDER BY reason
"""


def recent_activity(
    conn: psycopg.Connection[Any], run_id: str | None, domains_shown: int = TOP_DOMAINS
) -> dict[str, Any]:
    """Over the last RATE_WINDOW_S (of `run_id`, or of every run): pages per second, the
    `domains_shown` busiest domains, pages stored by each worker and dead letters by reason."""
    window = {"run_id": run_id, "window_s": RATE_WINDOW_S}
    row = conn.execute(PAGES_SINCE, window).fetchone()
    pages = int(row[0]) if row else 0
    domains = conn.execute(DOMAINS_SINCE, {**window, "limit": domains_shown}).fetchall()
    workers = conn.execute(WORKERS_SINCE, window).fetchall()
    dead = conn.execute(DEAD_BY_REASON_SINCE, window).fetchall()
    return {
        "window_s": RATE_WINDOW_S,
        "pages_in_window": pages,
        "pages_per_s": round(pages / RATE_WINDOW_S, 3),
        "top_domains": [{"domain": d or "", "pages": int(n)} for d, n in domains],
        "pages_by_worker": {str(w): int(n) for w, n in workers},
        "dead_letters": {str(reason): int(n) for reason, n in dead},
    }
