"""Writing results to PostgreSQL, in batches, with idempotent upserts keyed on (run_id, url).

Handler threads hand their rows to one writer thread per worker process. `save_page_later`
returns at once and calls back once the transaction holding the row has committed, and only
then is the message acked: a handler thread does not sit out the batch's wait and commit, it
fetches the next page meanwhile (`save_page` and `save_skip` wait). One connection and one
transaction per batch instead of one per page: a worker with 32 fetches in flight needs one
database connection, not 32. A redelivered message rewrites its row (`writes` counts how
often) instead of adding one.

This module gathers rows into batches and hands each to the writer's committer
(worker/store/commit.py: outages of PostgreSQL, rows it refuses for their data); the rows and
their SQL are in worker/store/rows.py.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from shared.postgres.skips import UPSERT_SKIP
from shared.settings import Settings
from worker.store.commit import PATIENCE_S, BatchCommitter, Committed, Pending
from worker.store.rows import STORE_PAGE, PageRow, SkipRow, clean, page_params

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
        self._submit(Pending([(STORE_PAGE, page_params(row))], committed))

    def save_page(self, row: PageRow) -> None:
        """Return once the row is committed."""
        waiter = _Waiter()
        self._submit(Pending([(STORE_PAGE, page_params(row))], waiter, waited_for=True))
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
