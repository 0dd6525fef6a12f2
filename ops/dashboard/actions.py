"""Pause, resume, cancel, replay and purge, each run as a background operation in a thread (a
resume waits out the workers' state cache and drains a hold queue, which can take minutes), and
each written as a row of `operator_actions` and a log line.

A bulk action acts on exactly what it counted: its dry run returns the count N and the highest
id K of the rows; the execute call carries both back, the rows with `id <= K` are counted again,
and a different count is refused with 409. Rows that arrive after the dry run are never included.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from psycopg.types.json import Jsonb

from dlq_consumer import store
from dlq_consumer.replay import replay
from ops import runs
from ops.dashboard.data import RunLookup
from ops.dashboard.deadletters import dry_run
from ops.dashboard.text import short_error, whole
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.errors import PipelineError
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.runstate import CANCELLED
from shared.settings import Settings

log = logging.getLogger(__name__)

AUDIT_TABLE = """
CREATE TABLE IF NOT EXISTS operator_actions (
    id bigserial PRIMARY KEY, at timestamptz DEFAULT now(), actor text, client text, action text,
    run_id text, selection jsonb, expected int, result jsonb, finished_at timestamptz)
"""
AUDIT_START = """
INSERT INTO operator_actions (actor, client, action, run_id, selection, expected)
VALUES (%s, %s, %s, %s, %s, %s) RETURNING id
"""
AUDIT_END = "UPDATE operator_actions SET result = %s, finished_at = now() WHERE id = %s"
MAX_IDS = 500
OPERATIONS_KEPT = 200


class ActionRefused(PipelineError):
    """An action that cannot go ahead: `status` is the HTTP answer (400, 404, 409)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


@dataclass
class Operation:
    id: str
    action: str
    run_id: str | None
    state: str = "running"  # running | done | failed
    progress: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    finished_at: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "run_id": self.run_id,
            "state": self.state,
            "progress": self.progress,
            "result": self.result,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True)
class Actor:
    role: str
    client: str


class Operations:
    """The operations of this process: at most one at a time per run (or per dead-letter action)."""

    def __init__(self, settings: Settings, spawn: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._ops: dict[str, Operation] = {}
        self._busy: set[str] = set()
        self._ids = itertools.count(1)
        self._spawn = spawn or (lambda work: threading.Thread(target=work, daemon=True).start())

    def get(self, op_id: str) -> Operation | None:
        return self._ops.get(op_id)

    def latest(self, run_id: str | None) -> list[Operation]:
        return [op for op in reversed(self._ops.values()) if run_id is None or op.run_id == run_id][:5]

    def start(
        self,
        actor: Actor,
        action: str,
        run_id: str | None,
        audit: dict[str, Any],
        work: Callable[[Operation], dict[str, Any]],
        expected: int | None = None,
    ) -> Operation:
        slot = run_id or "dead-letters"
        with self._lock:
            if slot in self._busy:
                raise ActionRefused(409, f"another operation on {slot} is still running")
            self._busy.add(slot)
            op = Operation(f"op-{next(self._ids)}", action, run_id)
            self._ops[op.id] = op
            while len(self._ops) > OPERATIONS_KEPT:
                self._ops.pop(next(iter(self._ops)))
        audit_id = self._audit_start(actor, action, run_id, audit, expected)

        def run() -> None:
            try:
                op.result = work(op)
                op.state = "done"
            except Exception as exc:  # an operation's failure is shown, never raised into a thread
                op.result = {"error": short_error(exc)}
                op.state = "failed"
            finally:
                op.finished_at = dt.datetime.now(dt.UTC).isoformat()
                with self._lock:
                    self._busy.discard(slot)
                self._audit_end(audit_id, op)
                log_action(actor, action, run_id, state=op.state, result=op.result)

        self._spawn(run)
        return op

    def audit(self, actor: Actor, action: str, run_id: str | None, result: dict[str, Any]) -> None:
        """The row of an action done at once (a run submitted), and its log line."""
        audit_id = self._audit_start(actor, action, run_id, {}, None)
        self._audit_end(audit_id, Operation("-", action, run_id, "done", result=result))
        log_action(actor, action, run_id, result=result)

    def ensure_table(self) -> None:
        db.ensure_schema(self.settings)  # the schema the table lives in, and the tables it reads
        with db.translate(self.settings), db.connect(self.settings, autocommit=True) as conn:
            conn.execute(AUDIT_TABLE)

    def _audit_start(
        self, actor: Actor, action: str, run_id: str | None, selection: dict[str, Any], expected: int | None
    ) -> int:
        self.ensure_table()
        with db.translate(self.settings), db.connect(self.settings, autocommit=True) as conn:
            row = conn.execute(
                AUDIT_START, (actor.role, actor.client, action, run_id, Jsonb(selection), expected)
            ).fetchone()
        return whole(row[0]) if row else 0

    def _audit_end(self, audit_id: int, op: Operation) -> None:
        try:
            with db.translate(self.settings), db.connect(self.settings, autocommit=True) as conn:
                conn.execute(AUDIT_END, (Jsonb({"state": op.state, **op.result}), audit_id))
        except PipelineError as exc:
            log.warning("audit row %d not finished: %s", audit_id, short_error(exc))


def log_action(actor: Actor, action: str, run_id: str | None, **outcome: Any) -> None:
    """The action's log line, a JSON object beside its audit row."""
    line = {"action": action, "run_id": run_id, "actor": actor.role, "client": actor.client, **outcome}
    log.info(json.dumps(line))


class Actions:
    """The five actions, checked here and carried out by Operations."""

    def __init__(self, settings: Settings, operations: Operations) -> None:
        self.settings = settings
        self.operations = operations

    def run_action(self, actor: Actor, action: str, run_id: str, confirm: str | None = None) -> Operation:
        client = connect_redis(self.settings, OPERATOR)
        try:
            lookup = RunLookup(self.settings, client)
            state = lookup.state(run_id)
            keys = lookup.keys(run_id)
            if lookup.prefix(run_id) is None and state == "running":
                raise ActionRefused(404, f"run {run_id!r}: no such run")
        finally:
            client.close()
        if state == CANCELLED and action != "cancel":
            raise ActionRefused(409, f"run {run_id!r} was cancelled; it cannot be {action}d")
        if action == "cancel" and confirm != run_id:
            raise ActionRefused(400, "to cancel, confirm must be the run id")
        if action not in ("pause", "resume", "cancel"):
            raise ActionRefused(404, f"no action {action!r}: pause, resume or cancel")

        def pause(client: redis.Redis) -> dict[str, Any]:
            runs.pause(self.settings, client, keys, run_id)
            return {"paused": True}

        steps: dict[str, Callable[[redis.Redis], dict[str, Any]]] = {
            "pause": pause,
            "resume": lambda c: {"moved": runs.resume(self.settings, c, keys, run_id)},
            "cancel": lambda c: {"skipped": runs.cancel(self.settings, c, keys, run_id)},
        }
        step = steps[action]

        def work(op: Operation) -> dict[str, Any]:
            op.progress = f"{action} {run_id}: started"
            worker_client = connect_redis(self.settings, OPERATOR)
            try:
                result = step(worker_client)
            finally:
                worker_client.close()
            op.progress = f"{action} {run_id}: " + ", ".join(f"{k} {v}" for k, v in result.items())
            return result

        return self.operations.start(actor, action, run_id, {"run_id": run_id}, work)

    def replay(
        self,
        actor: Actor,
        selection: store.Selection,
        expected: int | None,
        max_id: int | None,
        ids: list[int] | None,
    ) -> dict[str, Any] | Operation:
        chosen = self._chosen(replace(selection, state="dead"), max_id, ids)
        if expected is None:
            found = dry_run(self.settings, chosen)
            return {"would_replay": found["count"], "max_id": found["max_id"]}
        if max_id is None and ids is None:
            raise ActionRefused(400, "expected needs the max_id of its dry run")
        now = dry_run(self.settings, chosen)["count"]
        if ids is None and now != expected:
            raise ActionRefused(
                409, f"the selection changed: {now} dead letters now, {expected} shown", now=now
            )
        limited = replace(chosen, limit=expected)

        def work(op: Operation) -> dict[str, Any]:
            op.progress = f"replaying {expected} dead letters"
            with db.translate(self.settings), db.connect(self.settings, autocommit=True) as conn:
                connection = broker.connect(self.settings, "dashboard replay")
                try:
                    broker.declare_topology(connection, build_topology(self.settings))
                    channel = broker.confirm_channel(connection)
                    result = replay(
                        conn, lambda p: broker.publish(channel, p), limited, self.settings.crawl_namespace
                    )
                finally:
                    if connection.is_open:
                        connection.close()
            op.progress = f"replayed {result.replayed} of {expected}"
            return {"replayed": result.replayed, "skipped": result.skipped, "expected": expected}

        return self.operations.start(actor, "replay", selection.run_id, _described(limited), work, expected)

    def purge(
        self,
        actor: Actor,
        selection: store.Selection,
        expected: int | None,
        max_id: int | None,
        ids: list[int] | None,
        include_dead: bool,
    ) -> dict[str, Any] | Operation:
        if selection.state != "replayed" and not include_dead:
            raise ActionRefused(
                400, "purging dead rows takes include_dead: the run's accounting would then miss them"
            )
        chosen = self._chosen(selection, max_id, ids)
        if expected is None:
            found = dry_run(self.settings, chosen)
            dead = dry_run(self.settings, replace(chosen, state="dead"))["count"] if include_dead else 0
            return {"would_delete": found["count"], "max_id": found["max_id"], "dead_outcomes_lost": dead}
        if max_id is None and ids is None:
            raise ActionRefused(400, "expected needs the max_id of its dry run")
        with db.translate(self.settings), db.connect(self.settings) as conn:
            deleted = store.delete(conn, chosen)
            if deleted != expected:
                conn.rollback()
                raise ActionRefused(
                    409, f"the selection changed: {deleted} rows now, {expected} shown", now=deleted
                )
            conn.commit()
        return self.operations.start(
            actor, "purge", selection.run_id, _described(chosen), lambda op: {"deleted": deleted}, expected
        )

    @staticmethod
    def _chosen(selection: store.Selection, max_id: int | None, ids: list[int] | None) -> store.Selection:
        if ids is not None:
            if not ids or len(ids) > MAX_IDS:
                raise ActionRefused(400, f"ids: between 1 and {MAX_IDS} of them")
            return replace(selection, ids=tuple(ids), max_id=max_id)
        return replace(selection, max_id=max_id)


def _described(selection: store.Selection) -> dict[str, Any]:
    return {
        "run_id": selection.run_id,
        "reason": selection.reason,
        "state": selection.state,
        "max_id": selection.max_id,
        "ids": list(selection.ids) if selection.ids else None,
        "limit": selection.limit,
    }
