"""Dead letters as the pages and the API show them: a filter read from GET parameters, keyset
pages on `id` (never OFFSET), counts by run × reason, and one row with its body decoded as a
task (never shown raw). The rows are dlq_consumer.store's; replay and purge are in actions.py."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg.rows import class_row

from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord
from ops.dashboard.connections import Connections
from ops.dashboard.text import short_error, whole
from shared.errors import ConfigError, DecodeError
from shared.messages import CrawlTask
from shared.postgres import db
from shared.settings import Settings

PAGE_SIZE = 50
MAX_LIMIT = 500
SUMMARY_LIMIT = 200


@dataclass(frozen=True)
class Filter:
    """The GET parameters of /dead-letters, so that a view can be bookmarked."""

    run: str | None = None
    reason: str | None = None
    state: store.State = "dead"
    status: int | None = None
    queue: str | None = None
    q: str | None = None  # URL contains
    since: str | None = None  # last failed at or after (ISO 8601)
    until: str | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Filter:
        def text(name: str) -> str | None:
            value = query.get(name, "").strip()
            return value[:2000] or None

        state = text("state") or "dead"
        if state not in store.STATES:
            raise ConfigError(f"state must be one of {', '.join(store.STATES)}")
        status = text("status")
        if status is not None and not status.isdigit():
            raise ConfigError("status must be an HTTP status code")
        made = cls(
            text("run"),
            text("reason"),
            state,
            int(status) if status else None,
            text("queue"),
            text("q"),
            text("since"),
            text("until"),
        )
        if made.q and not (made.run or made.reason or made.status or made.queue):
            raise ConfigError("URL contains (q) needs another filter too, a run for instance")
        return made

    def params(self) -> dict[str, str]:
        """The filter as GET parameters again (for links that keep it)."""
        values = {
            "run": self.run,
            "reason": self.reason,
            "state": self.state,
            "status": self.status,
            "queue": self.queue,
            "q": self.q,
            "since": self.since,
            "until": self.until,
        }
        return {k: str(v) for k, v in values.items() if v is not None}

    def selection(self) -> store.Selection:
        """What replay and purge act on: run, reason and state (the other filters only narrow
        what is listed; the confirmation page says so)."""
        return store.Selection(run_id=self.run, reason=self.reason, state=self.state)

    def narrows_beyond_selection(self) -> bool:
        return any(v is not None for v in (self.status, self.queue, self.q, self.since, self.until))

    def where(self) -> tuple[sql.Composable, dict[str, Any]]:
        where, params = self.selection().where()
        clauses = [where]
        for column, key, value, op in (
            ("http_status", "status", self.status, "="),
            ("origin_queue", "queue", self.queue, "="),
            ("last_failed_at", "since", self.since, ">="),
            ("last_failed_at", "until", self.until, "<="),
        ):
            if value is not None:
                clauses.append(sql.SQL(f"{column} {op} %({key})s"))
                params[key] = value
        if self.q is not None:
            clauses.append(sql.SQL("url ILIKE %(q)s"))
            params["q"] = "%" + self.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return sql.SQL(" AND ").join(clauses), params


def rows(
    links: Connections, shown: Filter, after_id: int | None = None, limit: int = PAGE_SIZE
) -> list[dict[str, Any]]:
    """A page of summaries, newest first; `after_id` is the smallest id of the page before."""
    where, params = shown.where()
    if after_id is not None:
        where = sql.SQL("{} AND id < %(after_id)s").format(where)
        params["after_id"] = after_id
    query = sql.SQL("SELECT {} FROM dead_letters WHERE {} ORDER BY id DESC LIMIT {}").format(
        sql.SQL(store.COLUMNS), where, sql.Literal(min(limit, MAX_LIMIT))
    )
    with links.db() as conn, conn.cursor(row_factory=class_row(DeadLetterRecord)) as cur:
        found = cur.execute(query, params).fetchall()
    return [{**r.summary(), "last_error": short_error(r.last_error)} for r in found]


def summary(links: Connections, shown: Filter) -> list[dict[str, Any]]:
    """Counts by run × reason for the filter, biggest first."""
    where, params = shown.where()
    query = sql.SQL(
        "SELECT run_id, reason, count(*), max(id) FROM dead_letters WHERE {} GROUP BY run_id, reason "
        "ORDER BY count(*) DESC, run_id, reason LIMIT {}"
    ).format(where, sql.Literal(SUMMARY_LIMIT))
    with links.db() as conn:
        return [
            {"run_id": r, "reason": reason, "count": whole(n), "max_id": whole(m)}
            for r, reason, n, m in conn.execute(query, params)
        ]


def dry_run(settings: Settings, selection: store.Selection) -> dict[str, int]:
    """How many rows a replay or purge of `selection` would touch now, and the highest id among
    them: the execute call carries both back."""
    where, params = selection.where()
    query = sql.SQL("SELECT count(*), coalesce(max(id), 0) FROM dead_letters WHERE {}").format(where)
    with db.translate(settings), db.connect(settings, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return {"count": whole(row[0]) if row else 0, "max_id": whole(row[1]) if row else 0}


def detail(links: Connections, row_id: int) -> dict[str, Any] | None:
    """Every field of the row's summary, and its body decoded as a task, or only its size and
    digest when it is none."""
    query = sql.SQL("SELECT {} FROM dead_letters WHERE id = %(id)s").format(sql.SQL(store.COLUMNS))
    with links.db() as conn, conn.cursor(row_factory=class_row(DeadLetterRecord)) as cur:
        record = cur.execute(query, {"id": row_id}).fetchone()
    if record is None:
        return None
    body = bytes(record.body)
    try:
        task = CrawlTask.decode(body)
        decoded: dict[str, Any] | None = {
            "url": task.url,
            "queue": task.queue,
            "priority": task.priority,
            "run_id": task.run_id,
            "lastmod": task.lastmod,
        }
    except DecodeError:
        decoded = None
    return {
        **record.summary(),
        "task": decoded,
        "body_bytes": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }
