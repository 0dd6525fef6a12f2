"""The dead-letter store: the `dead_letters` table of shared/postgres/schema.sql, read and written here only.

A row is keyed on (run_id, url), so a message delivered twice rewrites its row, and a replayed URL
that dies again turns its row back to 'dead' instead of adding a second one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, LiteralString, Protocol

import psycopg
from psycopg import sql
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from dlq_consumer.record import DeadLetterRecord

State = Literal["dead", "replayed", "all"]
STATES: tuple[State, ...] = ("dead", "replayed", "all")

Connection = psycopg.Connection[Any]


class RecordWriter(Protocol):
    """What writing a record takes of a connection: a psycopg connection has it, and so can a
    small fake in a unit test."""

    @property
    def closed(self) -> bool: ...

    def execute(self, query: LiteralString, params: Mapping[str, Any]) -> object: ...

    def commit(self) -> None: ...

    def close(self) -> None: ...


UPSERT_DEAD_LETTER = """
INSERT INTO dead_letters (run_id, url, reason, last_error, http_status, attempts, replays,
                          origin_queue, worker_id, body, x_death, first_failed_at, body_bytes,
                          body_sha256)
SELECT %(run_id)s, %(url)s, %(reason)s, %(last_error)s, %(http_status)s, %(attempts)s,
       %(replays)s, %(origin_queue)s, %(worker_id)s, %(body)s, %(x_death)s,
       COALESCE(%(first_failed_at)s::timestamptz, now()), %(body_bytes)s,
       %(body_sha256)s
-- A stored page wins: a stale copy of a URL the run already stored (a redelivery, a copy that
-- crossed a crash) is not recorded as dead, so every URL keeps exactly one outcome.
WHERE NOT EXISTS (SELECT 1 FROM pages WHERE pages.run_id = %(run_id)s AND pages.url = %(url)s)
  -- likewise a URL already skipped (a copy taken after its run was cancelled)
  AND NOT EXISTS (SELECT 1 FROM skips WHERE skips.run_id = %(run_id)s AND skips.url = %(url)s)
ON CONFLICT (run_id, url) DO UPDATE SET
    reason = EXCLUDED.reason, last_error = EXCLUDED.last_error,
    http_status = EXCLUDED.http_status, attempts = EXCLUDED.attempts,
    -- a stale copy with an older count must not make the URL look replayed fewer times
    replays = GREATEST(dead_letters.replays, EXCLUDED.replays),
    origin_queue = EXCLUDED.origin_queue, worker_id = EXCLUDED.worker_id,
    body = EXCLUDED.body, x_death = EXCLUDED.x_death, body_bytes = EXCLUDED.body_bytes,
    body_sha256 = EXCLUDED.body_sha256, last_failed_at = now(), state = 'dead'
"""

COLUMNS = """id, run_id, url, reason, last_error, http_status, attempts, replays, origin_queue,
worker_id, body, x_death, first_failed_at, last_failed_at, state, replayed_at, body_bytes, body_sha256"""

# Locks the row until the caller's transaction ends: a second replay skips it, and a new failure
# of the same URL waits, so it cannot be overwritten by 'replayed' after it was recorded.
LOCK_NEXT_DEAD = (
    "SELECT " + COLUMNS + " FROM dead_letters WHERE {where} AND id > %(after_id)s"
    " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
)

MARK_REPLAYED = """
UPDATE dead_letters SET state = 'replayed', replayed_at = now() WHERE id = %(id)s AND state = 'dead'
"""


@dataclass(frozen=True)
class Selection:
    """Which rows an operator means: every field left empty matches everything."""

    run_id: str | None = None
    reason: str | None = None
    state: State = "dead"
    limit: int | None = None
    # The dashboard acts on exactly the rows it counted: those up to the highest id of its dry
    # run (a dead letter arriving later is left alone), or the ids ticked.
    max_id: int | None = None
    ids: tuple[int, ...] | None = None

    def where(self) -> tuple[sql.Composable, dict[str, Any]]:
        clauses: list[sql.Composable] = [sql.SQL("TRUE")]
        params: dict[str, Any] = {}
        if self.run_id is not None:
            clauses.append(sql.SQL("run_id = %(run_id)s"))
            params["run_id"] = self.run_id
        if self.reason is not None:
            clauses.append(sql.SQL("reason = %(reason)s"))
            params["reason"] = self.reason
        if self.state != "all":
            clauses.append(sql.SQL("state = %(state)s"))
            params["state"] = self.state
        if self.max_id is not None:
            clauses.append(sql.SQL("id <= %(max_id)s"))
            params["max_id"] = self.max_id
        if self.ids is not None:
            clauses.append(sql.SQL("id = ANY(%(ids)s)"))
            params["ids"] = list(self.ids)
        return sql.SQL(" AND ").join(clauses), params


def upsert(conn: RecordWriter, record: DeadLetterRecord) -> None:
    """Insert or rewrite the row of this URL; the caller commits."""
    conn.execute(
        UPSERT_DEAD_LETTER,
        {
            "run_id": record.run_id,
            "url": record.url,
            "reason": record.reason,
            "last_error": record.last_error,
            "http_status": record.http_status,
            "attempts": record.attempts,
            "replays": record.replays,
            "origin_queue": record.origin_queue,
            "worker_id": record.worker_id,
            "body": record.body,
            "x_death": Jsonb(record.x_death) if record.x_death is not None else None,
            "first_failed_at": record.first_failed_at,
            "body_bytes": record.body_bytes,
            "body_sha256": record.body_sha256,
        },
    )


def select_rows(conn: Connection, selection: Selection) -> list[DeadLetterRecord]:
    """The selected rows, newest first, so a limit keeps the latest failures."""
    where, params = selection.where()
    query = sql.SQL("SELECT {} FROM dead_letters WHERE {} ORDER BY id DESC").format(sql.SQL(COLUMNS), where)
    if selection.limit is not None:
        query = sql.SQL("{} LIMIT {}").format(query, sql.Literal(selection.limit))
    with conn.cursor(row_factory=class_row(DeadLetterRecord)) as cur:
        return cur.execute(query, params).fetchall()


def count(conn: Connection, selection: Selection) -> int:
    where, params = selection.where()
    row = conn.execute(sql.SQL("SELECT count(*) FROM dead_letters WHERE {}").format(where), params)
    found = row.fetchone()
    return int(found[0]) if found else 0


def delete(conn: Connection, selection: Selection) -> int:
    """Delete the selected rows (the limit is ignored); the caller commits."""
    where, params = selection.where()
    cur = conn.execute(sql.SQL("DELETE FROM dead_letters WHERE {}").format(where), params)
    return cur.rowcount


def lock_next_dead(conn: Connection, selection: Selection, after_id: int) -> DeadLetterRecord | None:
    """The next selected dead row after `after_id`, locked until the transaction ends."""
    where, params = dataclasses.replace(selection, state="dead", limit=None).where()
    query = sql.SQL(LOCK_NEXT_DEAD).format(where=where)
    with conn.cursor(row_factory=class_row(DeadLetterRecord)) as cur:
        return cur.execute(query, {**params, "after_id": after_id}).fetchone()


def mark_replayed(conn: Connection, row_id: int) -> None:
    conn.execute(MARK_REPLAYED, {"id": row_id})
