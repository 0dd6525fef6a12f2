"""Committing a batch of the writer's rows (worker/store/writer.py) to PostgreSQL, on a connection of
its own, with what a batch can meet on the way.

While PostgreSQL is unreachable the writer keeps its batch and tries again, with a growing
pause, for up to `patience_s`; rows handed in meanwhile wait behind it. Past that, the batch's
rows fail with ServiceUnavailable, and their messages go back to their queue.

A batch that PostgreSQL refuses for its data (`db.is_data_error`: a value out of range, an
index row too large) is no outage: the writer splits it in halves until the refused rows stand
alone, commits the others at once, and fails each refused row with UnstorableRow, carrying the
database's message, so that its message is dead-lettered. k bad rows in a batch of n cost about
2k·log2(n) more transactions; a batch without one costs nothing more.

Apart from the batching (worker/store/writer.py), which decides when a batch is written and never
talks to PostgreSQL: here a batch is written, and each of its rows is settled exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from shared import retrying
from shared.errors import PipelineError, ServiceUnavailable, UnstorableRow
from shared.postgres import db
from shared.settings import Settings

# The writer's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("worker.store")  # the name operators know: kept as the module moved

PATIENCE_S = 120.0  # how long a batch waits for an unreachable PostgreSQL before it fails

Committed = Callable[[BaseException | None], None]  # called with None once committed, else the error


@dataclass
class Pending:
    """A row handed in to the writer: its statements, and whom to tell once it is settled."""

    statements: list[tuple[str, dict[str, Any]]]  # written in the same transaction
    committed: Committed
    waited_for: bool = False  # a caller is blocked until it is committed: commit without delay


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


def _connect_autocommit(settings: Settings) -> psycopg.Connection[tuple[object, ...]]:
    return db.connect(settings, autocommit=True)


class _Interrupted(PipelineError):
    """PostgreSQL became unreachable part-way through a batch: these rows are not settled."""

    def __init__(self, error: ServiceUnavailable, unfinished: list[Pending]) -> None:
        super().__init__(str(error))
        self.error = error
        self.unfinished = unfinished
