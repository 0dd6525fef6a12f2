"""Recrawls: which URLs of a sitemap are due again, judged against an earlier run's pages.

    no page in the earlier run          due (new URL)
    <lastmod> given                     due if later than the earlier fetch
    <changefreq> given (no lastmod)     due if the earlier fetch is older than its period
    neither                             due: nothing says it is unchanged (and the cache turns
                                        an unchanged answer into a cheap 304)

The sitemap's own word wins: a page whose lastmod is not after our fetch is not fetched again,
whatever its changefreq says. URLs not due are counted in the producer's summary, not published.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

import psycopg

from shared.postgres import db
from shared.settings import Settings

CHANGEFREQ_S = {
    "always": 0.0,
    "hourly": 3600.0,
    "daily": 86_400.0,
    "weekly": 7 * 86_400.0,
    "monthly": 30 * 86_400.0,
    "yearly": 365 * 86_400.0,
    "never": math.inf,
}

FETCHED_AT = "SELECT url, fetched_at FROM pages WHERE run_id = %s AND url = ANY(%s)"


def parse_lastmod(text: str | None) -> datetime.datetime | None:
    """A W3C datetime ('2024-05-01', '2024-05-01T10:00:00Z', ...) as an aware datetime; None if
    absent or unreadable (an unreadable lastmod says nothing, so it cannot make a URL skip)."""
    if not text:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def is_due(
    lastmod: str | None,
    changefreq: str | None,
    fetched_at: datetime.datetime | None,
    now: datetime.datetime,
) -> bool:
    if fetched_at is None:
        return True
    modified = parse_lastmod(lastmod)
    if modified is not None:
        return modified > fetched_at
    period = CHANGEFREQ_S.get((changefreq or "").strip().lower())
    if period is not None:
        return (now - fetched_at).total_seconds() >= period
    return True


class PreviousRun:
    """Fetch times of an earlier run's pages, looked up a batch of URLs at a time."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.run_id = run_id
        self._settings = settings
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def fetched_at(self, urls: Sequence[str]) -> dict[str, datetime.datetime]:
        with db.translate(self._settings):
            if self._conn is None or self._conn.closed:
                self._conn = db.connect(self._settings, autocommit=True)
            rows = self._conn.execute(FETCHED_AT, (self.run_id, list(urls))).fetchall()
        return {str(url): when for url, when in rows if isinstance(when, datetime.datetime)}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
