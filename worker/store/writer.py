"""Writing results to PostgreSQL, in batches, with idempotent upserts keyed on (run_id, url).

Handler threads hand their rows to one writer thread per worker process. `save_page_later`
returns at once and calls back once the transaction holding the row has committed, and only
then is the message acked: a handler thread does not sit out the batch's wait and commit, it
fetches the next page meanwhile (`save_page` and `save_skip` wait). One connection and one
transaction per batch instead of one per page: a worker with 32 fetches in flight needs one
database connection, not 32. A redelivered message rewrites its row (`writes` counts how
often) instead of adding one.

Two objects, both of the writer's thread: ResultStore gathers rows into batches and decides when
one is written, and never talks to PostgreSQL; the BatchCommitter it holds writes each batch
and settles each of its rows exactly once, through what a batch can meet on the way:

- While PostgreSQL is unreachable the writer keeps its batch and tries again, with a growing
  pause, for up to `patience_s`; rows handed in meanwhile wait behind it. Past that, the
  batch's rows fail with ServiceUnavailable, and their messages go back to their queue.
- A batch that PostgreSQL refuses for its data (`db.is_data_error`: a value out of range, an
  index row too large) is no outage: the writer splits it in halves until the refused rows
  stand alone, commits the others at once, and fails each refused row with UnstorableRow,
  carrying the database's message, so that its message is dead-lettered. k bad rows in a batch
  of n cost about 2k·log2(n) more transactions; a batch without one costs nothing more.

The rows and their SQL are in worker/store/rows.py.
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

from shared import retrying
from shared.errors import PipelineError, ServiceUnavailable, UnstorableRow
from shared.postgres import db
from shared.postgres.skips import UPSERT_SKIP
from shared.settings import Settings
from worker.store.rows import STORE_PAGES, ManyRows, PageRow, SkipRow, clean, page_params

# The writer's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("worker.store")  # the name operators know: kept as the module moved

PATIENCE_S = 120.0  # how long a batch waits for an unreachable PostgreSQL before it fails

Committed = Callable[[BaseException | None], None]  # called with None once committed, else the error


@dataclass
class Pending:
    """A row handed in to the writer: its statements, and whom to tell once it is settled."""

    # Written in the same transaction. A ManyRows statement writes all of a batch's rows of it at
    # once; a plain one is sent once a row.
    statements: list[tuple[str | ManyRows, dict[str, Any]]]
    committed: Committed
    waited_for: bool = False  # a caller is blocked until it is committed: commit without delay


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
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        # `before_commit` runs before each batch's transaction: the WARC records' fsync.
        self._committer = BatchCommitter(settings, patience_s, sleep, connect, before_commit)
        self.batch_rows = batch_rows
        self.batch_wait_s = batch_wait_s
        # Handlers append; the writer takes whole batches. Two events instead of a queue.Queue:
        # a queue wakes the writer for every row, and each wake costs both threads a GIL handoff.
        self._pending: collections.deque[Pending | None] = collections.deque()
        self._arrived = threading.Event()  # rows are waiting (or the stop mark)
        self._batch_full = threading.Event()  # a whole batch is waiting: no need to wait for more
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        # Callers blocked on a row handed in and not yet taken by the writer: while there are
        # any, the writer does not wait for more rows.
        self._waiters = 0
        self._waiters_lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        """What the writer connects to PostgreSQL with; a change applies from its next connect."""
        return self._committer.settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._committer.settings = settings

    def save_page_later(self, row: PageRow, committed: Committed) -> None:
        """Hand the row in; `committed` is called on the writer's thread once it is committed
        (with None), or with the error that kept it out. It must not block: it only reports
        (worker/handling/storing.py), and the handler decides what the report means."""
        self._submit(Pending([(STORE_PAGES, page_params(row))], committed))

    def save_page(self, row: PageRow) -> None:
        """Return once the row is committed."""
        waiter = _Waiter()
        self._submit(Pending([(STORE_PAGES, page_params(row))], waiter, waited_for=True))
        self._wait(waiter)

    def save_skip(self, row: SkipRow) -> None:
        """Return once the row is committed."""
        waiter = _Waiter()
        params = {k: clean(v) for k, v in row.__dict__.items()}
        self._submit(Pending([(UPSERT_SKIP, params)], waiter, waited_for=True))
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
        self._committer.close()

    def _submit(self, pending: Pending) -> None:
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

    def _hand_in(self, item: Pending | None) -> None:
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
            batch: list[Pending] = []
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
                self._committer.write(batch)
            if stopping:
                return


class BatchCommitter:
    """Writes the writer's batches in transactions, and calls each row's `committed` once it is
    settled: committed, refused for its data, or given up on."""

    def __init__(
        self,
        settings: Settings,
        patience_s: float,
        sleep: Callable[[float], None],
        connect: Callable[[Settings], psycopg.Connection[tuple[object, ...]]] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        # Makes durable what the rows point at (the WARC records) before any of them commits.
        self._before_commit = before_commit
        self._connect = connect or _connect_autocommit
        self.patience_s = patience_s
        self._sleep = sleep
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def close(self) -> None:
        """Close the connection; call once no batch is being written."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def write(self, batch: list[Pending]) -> None:
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

    def _commit_isolating(self, batch: list[Pending]) -> None:
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

    def _commit(self, batch: list[Pending]) -> None:
        if self._before_commit is not None:
            self._before_commit()  # ServiceUnavailable when it cannot: an outage like PostgreSQL's
        with db.translate(self.settings):
            try:
                conn = self._connection()
                sent = _sent(batch)
                if len(sent) == 1 and len(sent[0][1]) == 1:
                    # The connection autocommits, so a lone statement is atomic without a
                    # transaction block: one round trip instead of BEGIN, it and COMMIT, and no
                    # pipeline to set up. A polite crawl's commits are mostly of one row; in 400
                    # one-row commits back to back this cost the writer 0.1 ms a row instead
                    # of 0.2, and PostgreSQL 0.15 ms instead of 0.2. A batch of pages alone is
                    # one statement too (STORE_PAGES).
                    query, rows = sent[0]
                    with conn.cursor() as cur:
                        cur.execute(query, rows[0])
                    return
                with conn.transaction(), conn.cursor() as cur:
                    for query, rows in sent:
                        if len(rows) == 1:
                            cur.execute(query, rows[0])
                        else:
                            cur.executemany(query, rows)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if not db.is_data_error(exc):
                    self._conn = None  # reconnect for the next batch
                raise

    @staticmethod
    def _finish(batch: list[Pending], error: BaseException | None) -> None:
        for pending in batch:
            try:
                pending.committed(error)
            except Exception:  # the writer must go on for everyone else
                log.exception("a commit callback failed")

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self.settings)
        return self._conn


def _sent(batch: list[Pending]) -> list[tuple[str, list[dict[str, Any]]]]:
    """What is sent for `batch`: each statement with the parameters of each of its executions.
    One execution of a ManyRows statement for the whole batch (more only for a row written twice
    in it); one executemany for a plain statement: psycopg sends its rows in one pipeline instead
    of a round trip per row, and the writer's thread, which every message of the worker waits on,
    gives up the GIL once per group."""
    groups: dict[str | ManyRows, list[dict[str, Any]]] = {}
    for pending in batch:
        for query, params in pending.statements:
            groups.setdefault(query, []).append(params)
    sent: list[tuple[str, list[dict[str, Any]]]] = []
    for query, rows in groups.items():
        if isinstance(query, ManyRows):
            sent += [(sql, [params]) for sql, params in query.executions(rows)]
        else:
            sent.append((query, rows))
    return sent


def _connect_autocommit(settings: Settings) -> psycopg.Connection[tuple[object, ...]]:
    conn = db.connect(settings, autocommit=True)
    # A batch's pages are one prepared statement over arrays. PostgreSQL would plan it afresh
    # for every batch, since a plan for the arrays at hand always looks cheaper than the generic
    # one, and that planning cost more than the rows: for batches of eight, 130 to 147 us of
    # PostgreSQL's CPU a page against 93 us with the generic plan (one throwaway measurement a
    # side, 3,000 pages each). The writer's statements are the same few, keyed on primary
    # keys, so the generic plan is the right one for every batch. Not behind a transaction
    # pooler: nothing is prepared there, and a session's setting would reach whichever client
    # gets that server session next (docs/SCALING.md).
    if settings.database_pooler != "transaction":
        conn.execute("SET plan_cache_mode = force_generic_plan")
    return conn


class _Interrupted(PipelineError):
    """PostgreSQL became unreachable part-way through a batch: these rows are not settled."""

    def __init__(self, error: ServiceUnavailable, unfinished: list[Pending]) -> None:
        super().__init__(str(error))
        self.error = error
        self.unfinished = unfinished
