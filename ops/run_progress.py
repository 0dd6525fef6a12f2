"""A run's progress as ops.crawl shows it (pages/s, ETA), read from what any machine can see.

ops.crawl computes its rate from snapshots it takes itself, so the figure lived only in its
terminal. Here the same figures come from committed state alone: the outcomes from the per-run
counters (run_counters, shared/postgres/schema.sql), the rate from the outcomes committed in the last
RATE_WINDOW_S seconds (their commit-time columns: pages.fetched_at, dead_letters.last_failed_at,
skips.recorded_at), the total from the run's Redis counters, and "still producing" from the key
every producer's heartbeat renews. ops.status --run, ops.runs show and the dashboard all call
`ProgressReader`, and print with shared.progress's own formatting, so every place shows the
same line.

The rate counts outcomes whose time falls in the window: a page rewritten by a redelivery has
its fetched_at moved and counts again, so the rate can read slightly high while copies are
being redelivered (the totals stay exact). A run younger than the window is measured over the
time since its first outcome, where ops.crawl measures from its own start (before the first
page): in a run's first half minute the two differ (163 against 107 pages/min 25 s into a demo
crawl), and once it is older they agree within a few percent (156 against 149).
"""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg
import redis

from ops.accounting import OUTCOMES
from shared.errors import ServiceUnavailable
from shared.postgres import db
from shared.progress import RATE_WINDOW_S, Snapshot, eta_s, live_detail, periodic_line
from shared.redis.client import GLANCE, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.redis.runstate import recorded_enqueued
from shared.settings import Settings

# The outcomes committed within the window, and the seconds since the run's first outcome.
RECENT_OUTCOMES = """
SELECT (SELECT count(*) FROM pages WHERE run_id = %(run_id)s AND fetched_at > now() - %(window)s)
     + (SELECT count(*) FROM dead_letters WHERE run_id = %(run_id)s AND state = 'dead'
        AND last_failed_at > now() - %(window)s)
     + (SELECT count(*) FROM skips WHERE run_id = %(run_id)s AND recorded_at > now() - %(window)s),
       (SELECT extract(epoch FROM now() - min(first_at))::float8 FROM run_counters
        WHERE run_id = %(run_id)s AND kind IN ('page', 'dead', 'skip'))
"""
MIN_SPAN_S = 1.0  # a run that stored its first page a moment ago is not measured over that moment


@dataclass(frozen=True)
class RunProgress:
    run_id: str
    enqueued: int
    stored: int
    dead: int
    skipped: int
    pages_per_s: float
    producing: bool  # a producer of the run is alive: the total may still grow
    queued: int | None = None  # ready messages in the work queues (of every run), if known
    window_s: float = RATE_WINDOW_S

    @property
    def done(self) -> int:
        return self.stored + self.dead + self.skipped

    @property
    def left(self) -> int:
        return max(0, self.enqueued - self.done)

    @property
    def eta_s(self) -> float | None:
        return eta_s(self.snapshot(), self.pages_per_s)

    def snapshot(self) -> Snapshot:
        return Snapshot(0.0, self.enqueued, self.stored, self.dead, self.skipped, self.queued, self.producing)

    def line(self) -> str:
        """The plain line ops.crawl prints every few seconds: "stored 120 (600 pages/min), ..."."""
        return periodic_line(self.snapshot(), self.pages_per_s)

    def detail(self) -> str:
        """What ops.crawl's live line shows after its bar: "3.1 pages/s  ETA 2m05s  ..."."""
        return live_detail(self.snapshot(), self.pages_per_s)

    def as_json(self) -> dict[str, Any]:
        eta = self.eta_s
        return {
            "run_id": self.run_id,
            "enqueued": self.enqueued,
            "stored": self.stored,
            "dead": self.dead,
            "skipped": self.skipped,
            "left": self.left,
            "pages_per_s": round(self.pages_per_s, 2),
            "eta_s": None if eta is None else round(eta, 1),
            "producing": self.producing,
            "window_s": self.window_s,
        }


def rate_per_s(recent: int, age_s: float | None, window_s: float) -> float:
    """Outcomes per second over the window, or over the run's age when it is younger."""
    if age_s is None or recent <= 0:
        return 0.0
    return recent / min(window_s, max(age_s, MIN_SPAN_S))


def producing(client: redis.Redis, prefix: str, run_id: str) -> bool:
    """A producer of the run beats (producer/liveness.py renews Keys.run_producing)."""
    return bool(client.exists(Keys(prefix).run_producing(run_id)))


class ProgressReader:
    """Reads runs' progress over one PostgreSQL connection and one Redis client kept open (the
    Tally pattern); a lost connection is opened again by the next read. A caller that holds
    connections of its own (the dashboard) lends them with `conn` and `client`: those are used
    as they are and never closed here."""

    def __init__(
        self,
        settings: Settings,
        window_s: float = RATE_WINDOW_S,
        *,
        conn: psycopg.Connection[tuple[object, ...]] | None = None,
        client: redis.Redis | None = None,
    ) -> None:
        self._settings = settings
        self._window_s = window_s
        self._lent_conn = conn
        self._lent_client = client
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._redis: redis.Redis | None = None

    def read(self, run_id: str, prefix: str | None = None, queued: int | None = None) -> RunProgress:
        """The run's progress; its Redis counters under `prefix` (default REDIS_PREFIX).
        Raises ServiceUnavailable when PostgreSQL or Redis cannot be reached."""
        stored, dead, skipped, recent, age_s = self._outcomes(run_id)
        client = self._client()
        prefix = prefix or self._settings.redis_prefix
        with translate_redis_errors(self._settings.redis_url):
            enqueued = recorded_enqueued(client, Keys(prefix), run_id)
            alive = producing(client, prefix, run_id)
        return RunProgress(
            run_id=run_id,
            enqueued=enqueued,
            stored=stored,
            dead=dead,
            skipped=skipped,
            pages_per_s=rate_per_s(recent, age_s, self._window_s),
            producing=alive,
            queued=queued,
            window_s=self._window_s,
        )

    def _outcomes(self, run_id: str) -> tuple[int, int, int, int, float | None]:
        params = {"run_id": run_id, "window": datetime.timedelta(seconds=self._window_s)}
        try:
            with db.translate(self._settings):
                conn = self._connection()
                totals = conn.execute(OUTCOMES, params).fetchone()
                window = conn.execute(RECENT_OUTCOMES, params).fetchone()
        except ServiceUnavailable:
            self._close_db()
            raise
        assert totals is not None and window is not None
        stored, dead, skipped = (int(v) for v in totals)  # type: ignore[call-overload]
        recent, age_s = window
        return stored, dead, skipped, int(recent), None if age_s is None else float(age_s)  # type: ignore[call-overload,arg-type]

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._lent_conn is not None:
            return self._lent_conn
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._close_db()
            self._conn = db.connect(self._settings, autocommit=True)
        return self._conn

    def _client(self) -> redis.Redis:
        if self._lent_client is not None:
            return self._lent_client
        if self._redis is None:
            self._redis = connect_redis(self._settings, GLANCE)
        return self._redis

    def _close_db(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        self._close_db()
        client, self._redis = self._redis, None
        if client is not None:
            client.close()

    def __enter__(self) -> ProgressReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def run_progress(settings: Settings, run_id: str, prefix: str | None = None) -> RunProgress:
    """One run's progress, with connections opened and closed for the one read."""
    with ProgressReader(settings) as reader:
        return reader.read(run_id, prefix)
