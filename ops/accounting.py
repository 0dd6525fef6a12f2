"""Where every URL of a run ended: stored, dead-lettered or skipped. Read from PostgreSQL only,
because that is where outcomes are committed before any message is acked."""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import psycopg

from shared.errors import ServiceUnavailable
from shared.postgres import db
from shared.settings import Settings

# Every figure comes from run_counters (shared/postgres/schema.sql), which triggers keep in the same
# transaction as the rows they count: a run's figures cost a few index lookups whatever its
# size, where count(*) over its rows grew with it (about 1 s at 1,000,000 pages).
COUNTERS = """
SELECT kind, reason, sum(n), sum(from_cache), sum(after_retry), sum(retries), sum(rewritten)
FROM run_counters WHERE run_id = %s GROUP BY kind, reason HAVING sum(n) <> 0 OR sum(retries) <> 0
ORDER BY kind, reason
"""
OUTCOMES = """
SELECT coalesce(sum(n) FILTER (WHERE kind = 'page'), 0)::bigint,
       coalesce(sum(n) FILTER (WHERE kind = 'dead'), 0)::bigint,
       coalesce(sum(n) FILTER (WHERE kind = 'skip'), 0)::bigint
FROM run_counters WHERE run_id = %(run_id)s AND kind IN ('page', 'dead', 'skip')
"""
ACCOUNTED = f"SELECT o.stored + o.dead + o.skipped FROM ({OUTCOMES}) AS o (stored, dead, skipped)"
# The runs with the latest activity, newest first, keyset-paged on last_activity (`before`).
LATEST_RUNS = """
SELECT run_id, coalesce(sum(n) FILTER (WHERE kind = 'page'), 0)::bigint,
       coalesce(sum(n) FILTER (WHERE kind = 'dead'), 0)::bigint,
       coalesce(sum(n) FILTER (WHERE kind = 'skip'), 0)::bigint, max(last_at)
FROM run_counters WHERE kind IN ('page', 'dead', 'skip')
GROUP BY run_id HAVING max(last_at) IS NOT NULL AND max(last_at) < %(before)s
ORDER BY max(last_at) DESC, run_id LIMIT %(limit)s
"""
FAR_FUTURE = datetime.datetime.max.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class RunTotals:
    """A run's outcomes so far, for a list of runs."""

    run_id: str
    stored: int
    dead: int
    skipped: int
    last_activity: datetime.datetime

    @property
    def accounted(self) -> int:
        return self.stored + self.dead + self.skipped


def latest_runs(
    conn: psycopg.Connection[Any], limit: int = 50, before: datetime.datetime | None = None
) -> list[RunTotals]:
    """Up to `limit` runs, latest activity first; `before` (a run's last_activity) pages on."""
    rows = conn.execute(LATEST_RUNS, {"before": before or FAR_FUTURE, "limit": limit}).fetchall()
    return [RunTotals(str(r), int(p), int(d), int(s), t) for r, p, d, s, t in rows]


@dataclass(frozen=True)
class Accounting:
    run_id: str
    stored: int = 0
    from_cache: int = 0
    stored_after_retry: int = 0
    rewritten_rows: int = 0  # rows a redelivery wrote twice (still one row each)
    retries: int = 0  # failed attempts that were tried again
    dead_by_reason: dict[str, int] = field(default_factory=dict)
    skips_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def dead(self) -> int:
        return sum(self.dead_by_reason.values())

    @property
    def skipped(self) -> int:
        return sum(self.skips_by_reason.values())

    @property
    def accounted(self) -> int:
        return self.stored + self.dead + self.skipped


def account(settings: Settings, run_id: str) -> Accounting:
    with db.translate(settings), db.connect(settings, autocommit=True) as conn:
        return account_on(conn, run_id)


def account_on(conn: psycopg.Connection[Any], run_id: str) -> Accounting:
    """account() over a connection the caller holds."""
    pages = (0, 0, 0, 0, 0)
    dead: dict[str, int] = {}
    skips: dict[str, int] = {}
    dead_retries = 0
    for kind, reason, n, cached, after_retry, retries, rewritten in conn.execute(COUNTERS, (run_id,)):
        if kind == "page":
            pages = (int(n), int(cached), int(after_retry), int(retries), int(rewritten))
        elif kind == "dead":
            dead[str(reason)] = int(n)
            dead_retries += int(retries)
        elif kind == "skip":
            skips[str(reason)] = int(n)
    stored, cached, after_retry, page_retries, rewritten = pages
    return Accounting(
        run_id=run_id,
        stored=stored,
        from_cache=cached,
        stored_after_retry=after_retry,
        rewritten_rows=rewritten,
        retries=page_retries + dead_retries,
        dead_by_reason={r: n for r, n in dead.items() if n},
        skips_by_reason={r: n for r, n in skips.items() if n},
    )


class Tally:
    """The number of a run's URLs accounted for so far, asked as often as a waiting caller
    likes: over one connection kept open, in one query. account() opens a connection (a new
    server process) and reads every figure, which cost PostgreSQL about 8 ms of CPU at 5,000
    pages, several times a second, taken from the crawl being watched. A connection that was
    lost (ServiceUnavailable from a query) is opened again by the next query."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self._settings = settings
        self._run_id = run_id
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._connection()  # a database that cannot be reached at the start is an error at once

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            with db.translate(self._settings):
                self._conn = db.connect(self._settings, autocommit=True)
        return self._conn

    def _row(self, query: str) -> tuple[object, ...]:
        try:
            with db.translate(self._settings):
                row = self._connection().execute(query, {"run_id": self._run_id}).fetchone()
        except ServiceUnavailable:
            self.close()  # the next query connects afresh
            raise
        assert row is not None
        return row

    def accounted(self) -> int:
        count = self._row(ACCOUNTED)[0]
        assert isinstance(count, int)
        return count

    def outcomes(self) -> tuple[int, int, int]:
        """(stored, dead-lettered, skipped) so far, in one query."""
        stored, dead, skipped = (int(v) for v in self._row(OUTCOMES))  # type: ignore[call-overload]
        return stored, dead, skipped

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def __enter__(self) -> Tally:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
