"""Writing results to PostgreSQL, in batches, with idempotent upserts keyed on (run_id, url).

Handler threads hand their rows to one writer thread per worker process. `save_page_later`
returns at once and calls back once the transaction holding the row has committed, and only
then is the message acked: a handler thread does not sit out the batch's wait and commit, it
fetches the next page meanwhile (`save_page` and `save_skip` wait). One connection and one
transaction per batch instead of one per page: a worker with 32 fetches in flight needs one
database connection, not 32. A redelivered message rewrites its row (`writes` counts how
often) instead of adding one.

While PostgreSQL is unreachable the writer keeps its batch and tries again, with a growing
pause, for up to `patience_s`; rows handed in meanwhile wait behind it. Past that, the batch's
rows fail with ServiceUnavailable, and their messages go back to their queue.

A batch that PostgreSQL refuses for its data (`db.is_data_error`: a value out of range, an
index row too large) is no outage: the writer splits it in halves until the refused rows stand
alone, commits the others at once, and fails each refused row with UnstorableRow, carrying the
database's message, so that its message is dead-lettered. k bad rows in a batch of n cost about
2k·log2(n) more transactions; a batch without one costs nothing more.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from shared import db, retrying
from shared.errors import PipelineError, ServiceUnavailable, UnstorableRow
from shared.settings import Settings

log = logging.getLogger(__name__)

BATCH_ROWS = 200
# How long the first row of a batch waits for more before the writer commits what it has. A
# batch is full at a worker's fetches in flight (wiring.py), so a busy worker commits long before
# this; it matters when pages trickle in, as in a polite crawl, where each commit of a row or two
# is mostly fixed cost, paid by a writer, a broker thread (the acks) and a marks thread each
# woken from a pause. At 4 pages/s over 3 workers, 1 s instead of 20 ms cost the workers 2 ms
# (15%) less CPU a page and PostgreSQL 0.5 ms (35%) less; at 2 pages/s over 3 workers, 5 s
# instead of 1 s cost them 4-30% less again, in five pairs (docs/POLITENESS.md). The price is an
# ack, and a page's row in the database, up to that much later; a worker with nothing else in
# hand commits at once (`commit_soon`), so the end of a crawl does not wait, and a caller that
# waits for its row (save_page, save_skip) does not wait for the batch.
BATCH_WAIT_S = 5.0
PATIENCE_S = 120.0  # how long a batch waits for an unreachable PostgreSQL before it fails

UPSERT_PAGE = """
INSERT INTO pages (run_id, url, final_url, http_status, content_type, title, meta_description,
                   canonical_url, lang, h1, body_text, links, queue, failed_attempts, from_cache,
                   not_modified, proxy, fetch_ms, worker_id, content_hash, profile, extracted,
                   unchanged)
VALUES (%(run_id)s, %(url)s, %(final_url)s, %(http_status)s, %(content_type)s, %(title)s,
        %(meta_description)s, %(canonical_url)s, %(lang)s, %(h1)s, %(body_text)s, %(links)s,
        %(queue)s, %(failed_attempts)s, %(from_cache)s, %(not_modified)s, %(proxy)s, %(fetch_ms)s,
        %(worker_id)s, %(content_hash)s, %(profile)s, %(extracted)s,
        -- On a recrawl: does the text match the earlier run's? NULL when there is nothing to compare.
        (SELECT earlier.content_hash = %(content_hash)s FROM pages AS earlier
         WHERE earlier.run_id = %(previous_run)s AND earlier.url = %(url)s))
ON CONFLICT (run_id, url) DO UPDATE SET
    final_url = EXCLUDED.final_url, http_status = EXCLUDED.http_status,
    content_type = EXCLUDED.content_type, title = EXCLUDED.title,
    meta_description = EXCLUDED.meta_description, canonical_url = EXCLUDED.canonical_url,
    lang = EXCLUDED.lang, h1 = EXCLUDED.h1, body_text = EXCLUDED.body_text, links = EXCLUDED.links,
    queue = EXCLUDED.queue, failed_attempts = GREATEST(pages.failed_attempts, EXCLUDED.failed_attempts),
    from_cache = EXCLUDED.from_cache, not_modified = EXCLUDED.not_modified, proxy = EXCLUDED.proxy,
    fetch_ms = EXCLUDED.fetch_ms, worker_id = EXCLUDED.worker_id,
    content_hash = EXCLUDED.content_hash, profile = EXCLUDED.profile, extracted = EXCLUDED.extracted,
    unchanged = EXCLUDED.unchanged,
    fetched_at = now(), writes = pages.writes + 1
"""

# The other order: a URL dead-lettered by one copy and then stored by another. The page wins,
# and the dead letter is kept for inspection but no longer counts (state 'superseded').
SUPERSEDE_DEAD_LETTER = """
UPDATE dead_letters SET state = 'superseded'
WHERE run_id = %(run_id)s AND url = %(url)s AND state = 'dead'
"""

# Likewise a URL skipped by one copy (its run cancelled) while another was being fetched: the
# page wins and the skip goes, so the URL is counted once.
DROP_SKIP = "DELETE FROM skips WHERE run_id = %(run_id)s AND url = %(url)s"

# Every URL keeps one outcome: a copy skipped after another copy's page was stored or its dead
# letter recorded (a duplicate taken after `cancel`) adds no skip.
UPSERT_SKIP = """
INSERT INTO skips (run_id, url, reason, detail, worker_id)
SELECT %(run_id)s, %(url)s, %(reason)s, %(detail)s, %(worker_id)s
WHERE NOT EXISTS (SELECT 1 FROM pages WHERE pages.run_id = %(run_id)s AND pages.url = %(url)s)
  AND NOT EXISTS (SELECT 1 FROM dead_letters AS d
                  WHERE d.run_id = %(run_id)s AND d.url = %(url)s AND d.state = 'dead')
ON CONFLICT (run_id, url) DO UPDATE SET
    reason = EXCLUDED.reason, detail = EXCLUDED.detail, worker_id = EXCLUDED.worker_id,
    recorded_at = now()
"""


# The page's upsert and its two clean-ups above, as one statement: data-modifying CTEs run
# whether or not the outer query reads them, in the same snapshot (the three touch different
# tables). One statement a row instead of three cost PostgreSQL 17-44% less CPU a row, and the
# writer 33-45% less, in batches of 1 to 16 rows.
STORE_PAGE = f"""
WITH page AS ({UPSERT_PAGE.strip()} RETURNING 1),
     superseded AS ({SUPERSEDE_DEAD_LETTER.strip()}),
     dropped AS ({DROP_SKIP.strip()})
SELECT 1
"""


@dataclass(frozen=True)
class PageRow:
    run_id: str
    url: str
    final_url: str
    http_status: int
    content_type: str
    title: str | None
    meta_description: str | None
    canonical_url: str | None
    lang: str | None
    h1: str | None
    body_text: str
    links: list[str]
    queue: str
    failed_attempts: int
    from_cache: bool
    fetch_ms: int | None
    worker_id: str
    not_modified: bool = False  # a 304 answer: the cached body was reused
    proxy: str | None = None  # scheme://host:port it came through, never credentials
    content_hash: str | None = None  # of the visible text, to tell unchanged pages on a recrawl
    profile: str | None = None  # the extraction profile that applied
    extracted: dict[str, Any] = field(default_factory=dict)
    previous_run: str | None = None  # on a recrawl, the run to compare content_hash with


@dataclass(frozen=True)
class SkipRow:
    run_id: str
    url: str
    reason: str
    detail: str
    worker_id: str


Committed = Callable[[BaseException | None], None]  # called with None once committed, else the error


@dataclass
class _Pending:
    statements: list[tuple[str, dict[str, Any]]]  # written in the same transaction
    committed: Committed
    waited_for: bool = False  # a caller is blocked until it is committed: commit without delay


@dataclass
class _Waiter:
    """A caller that waits for its row (save_page, save_skip)."""

    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __call__(self, error: BaseException | None) -> None:
        self.error = error
        self.done.set()


class ResultStore:
    """Batched, committed writes: `save_page_later` calls back once its row is committed, the
    other `save_*` return only then."""

    def __init__(
        self,
        settings: Settings,
        batch_rows: int = BATCH_ROWS,
        batch_wait_s: float = BATCH_WAIT_S,
        patience_s: float = PATIENCE_S,
        sleep: Callable[[float], None] = time.sleep,
        connect: Callable[[Settings], psycopg.Connection[tuple[object, ...]]] | None = None,
    ) -> None:
        self.settings = settings
        self._connect = connect or _connect_autocommit
        self.batch_rows = batch_rows
        self.batch_wait_s = batch_wait_s
        self.patience_s = patience_s
        self._sleep = sleep
        # Handlers append; the writer takes whole batches. Two events instead of a queue.Queue:
        # a queue wakes the writer for every row, and each wake costs both threads a GIL handoff.
        self._pending: collections.deque[_Pending | None] = collections.deque()
        self._arrived = threading.Event()  # rows are waiting (or the stop mark)
        self._batch_full = threading.Event()  # a whole batch is waiting: no need to wait for more
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        # Callers blocked on a row handed in and not yet taken by the writer: while there are
        # any, the writer does not wait for more rows.
        self._waiters = 0
        self._waiters_lock = threading.Lock()

    def save_page_later(self, row: PageRow, committed: Committed) -> None:
        """Hand the row in; `committed` is called on the writer's thread once it is committed
        (with None), or with the error that kept it out. It must not block."""
        self._submit(_Pending([(STORE_PAGE, _page_params(row))], committed))

    def save_page(self, row: PageRow) -> None:
        """Return once the row is committed."""
        waiter = _Waiter()
        self._submit(_Pending([(STORE_PAGE, _page_params(row))], waiter, waited_for=True))
        self._wait(waiter)

    def save_skip(self, row: SkipRow) -> None:
        """Return once the row is committed."""
        waiter = _Waiter()
        params = {k: _clean(v) for k, v in row.__dict__.items()}
        self._submit(_Pending([(UPSERT_SKIP, params)], waiter, waited_for=True))
        self._wait(waiter)

    def commit_soon(self) -> None:
        """Commit the rows waiting now rather than wait out the batch window: the worker has
        nothing else in hand, so no row is on its way to share their transaction."""
        if self._pending:
            self._batch_full.set()

    def close(self) -> None:
        """Stop the writer once it has written what it holds; call after the handlers stopped."""
        with self._writer_lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            self._hand_in(None)
            writer.join(timeout=30)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _submit(self, pending: _Pending) -> None:
        self._ensure_writer()
        self._hand_in(pending)

    @staticmethod
    def _wait(waiter: _Waiter) -> None:
        waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error

    def _ensure_writer(self) -> None:
        with self._writer_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_batches, name="result-writer", daemon=True)
                self._writer.start()

    def _hand_in(self, item: _Pending | None) -> None:
        if item is not None and item.waited_for:
            with self._waiters_lock:
                self._waiters += 1
        self._pending.append(item)
        if item is None or item.waited_for or len(self._pending) >= self.batch_rows:
            self._batch_full.set()
        if not self._arrived.is_set():
            self._arrived.set()

    def _write_batches(self) -> None:
        while True:
            self._arrived.wait()
            # Rows arriving meanwhile share the transaction, unless a whole batch is already here.
            self._batch_full.wait(self.batch_wait_s)
            # Cleared before taking rows: a row handed in after this sets them again.
            self._arrived.clear()
            self._batch_full.clear()
            batch: list[_Pending] = []
            stopping = False
            while self._pending and len(batch) < self.batch_rows:
                item = self._pending.popleft()
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            taken_waiters = sum(1 for item in batch if item.waited_for)
            with self._waiters_lock:
                self._waiters -= taken_waiters
                waiters_left = self._waiters > 0
            if self._pending:  # more than a batch was waiting
                self._arrived.set()
                if len(self._pending) >= self.batch_rows or self._pending[-1] is None or waiters_left:
                    self._batch_full.set()  # a whole batch, the stop mark or a waiting caller
            if batch:
                self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[_Pending]) -> None:
        unfinished = batch  # what an outage left of the batch: the next try starts from there

        def commit() -> None:
            nonlocal unfinished
            try:
                self._commit_isolating(unfinished)
            except _Interrupted as outage:
                unfinished = outage.unfinished
                raise

        def on_pause(outage: BaseException, pause_s: float) -> None:
            assert isinstance(outage, _Interrupted)
            log.warning(
                "cannot store %d rows yet (%s); trying again in %.0fs",
                len(outage.unfinished),
                outage.error,
                pause_s,
            )

        try:
            retrying.patiently(
                _Interrupted, retrying.stop_after_pausing(self.patience_s), self._sleep, on_pause
            )(commit)
        except _Interrupted as outage:
            self._finish(outage.unfinished, outage.error)

    def _commit_isolating(self, batch: list[_Pending]) -> None:
        """Commit `batch`; a part refused for its data is split in halves until each refused row
        stands alone, and every other row is committed. Each row is finished (its callback
        called) once settled; an outage raises _Interrupted with the rows not yet finished."""
        parts = [batch]
        while parts:
            part = parts.pop()
            try:
                self._commit(part)
            except ServiceUnavailable as exc:
                raise _Interrupted(exc, [p for rest in parts for p in rest] + part) from None
            except (psycopg.Error, UnicodeEncodeError) as exc:
                if len(part) > 1:
                    half = len(part) // 2
                    parts += [part[half:], part[:half]]  # the first half is tried first
                    continue
                if db.is_data_error(exc):
                    log.warning("PostgreSQL refused a row for its data: %s", db.error_line(exc))
                    self._finish(part, UnstorableRow(db.error_line(exc)))
                else:  # not the data's fault, nor an outage: our bug; the consumer dead-letters it
                    self._finish(part, exc)
                continue
            self._finish(part, None)

    def _commit(self, batch: list[_Pending]) -> None:
        with db.translate(self.settings):
            try:
                conn = self._connection()
                statements = [statement for pending in batch for statement in pending.statements]
                if len(statements) == 1:
                    # The connection autocommits, so a lone statement is atomic without a
                    # transaction block: one round trip instead of BEGIN, it and COMMIT, and no
                    # pipeline to set up. A polite crawl's commits are mostly of one row; in 400
                    # one-row commits back to back this cost the writer 0.1 ms a row instead
                    # of 0.2, and PostgreSQL 0.15 ms instead of 0.2.
                    query, params = statements[0]
                    with conn.cursor() as cur:
                        cur.execute(query, params)
                    return
                # One executemany per statement: psycopg sends each group's rows in one
                # pipeline instead of a round trip per row, and this thread, which every message
                # of the worker waits on, gives up the GIL once per group instead of once per row.
                groups: dict[str, list[dict[str, Any]]] = {}
                for query, params in statements:
                    groups.setdefault(query, []).append(params)
                with conn.transaction(), conn.cursor() as cur:
                    for query, rows in groups.items():
                        cur.executemany(query, rows)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if not db.is_data_error(exc):
                    self._conn = None  # reconnect for the next batch
                raise

    @staticmethod
    def _finish(batch: list[_Pending], error: BaseException | None) -> None:
        for pending in batch:
            try:
                pending.committed(error)
            except Exception:  # the writer must go on for everyone else
                log.exception("a commit callback failed")

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self.settings)
        return self._conn


def _connect_autocommit(settings: Settings) -> psycopg.Connection[tuple[object, ...]]:
    return db.connect(settings, autocommit=True)


class _Interrupted(PipelineError):
    """PostgreSQL became unreachable part-way through a batch: these rows are not settled."""

    def __init__(self, error: ServiceUnavailable, unfinished: list[_Pending]) -> None:
        super().__init__(str(error))
        self.error = error
        self.unfinished = unfinished


def _page_params(row: PageRow) -> dict[str, Any]:
    params = {k: _clean(v) for k, v in row.__dict__.items()}
    params["links"] = Jsonb(params["links"])
    params["extracted"] = Jsonb(params["extracted"])
    return params


def _clean(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL characters; a hostile page can."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value
