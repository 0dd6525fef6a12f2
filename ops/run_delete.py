"""Deleting a run: `python -m ops.runs delete RUN [--force]`, and `python -m ops.crawl --fresh`.

A run leaves rows (pages, dead_letters, skips with its run_id), Redis keys (its dedup hashes,
counters, state, seeding summary and producer heartbeats: shared/redis/keys.py) and perhaps a hold
queue (`<ns>.held.<run>`). Deleting it removes all three, so that the same run id starts from
nothing.

It is refused while the run still has work in the pipeline: URLs enqueued and not yet stored,
dead-lettered or skipped (queued, in flight or deferred), or messages in its hold queue. The
workers would fetch those URLs after the delete and write rows for a run that no longer has
its counters. `--force` deletes anyway: the held messages go with their queue, and messages
still queued come back as rows when workers take them (cancel the run first to make them skips).
Shared state that is not the run's (the response cache, a domain's rate) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pika.exceptions
import redis

from ops.accounting import account
from shared.amqp import broker
from shared.errors import ConfigError
from shared.postgres import db
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.redis.runstate import held_queue, recorded_enqueued
from shared.settings import Settings

DELETE_ROWS = (
    "DELETE FROM pages WHERE run_id = %(run)s",
    "DELETE FROM dead_letters WHERE run_id = %(run)s",
    "DELETE FROM skips WHERE run_id = %(run)s",
)
# Its counters and timeline buckets (run_counters, run_timeline: the triggers leave them at zero
# once the rows are gone), so that the run leaves the runs list too.
DELETE_COUNTERS = (
    "DELETE FROM run_counters WHERE run_id = %(run)s",
    "DELETE FROM run_timeline WHERE run_id = %(run)s",
)
# A discovery run's options kept beside Redis's copy (producer/discovery_store.py): a run started
# again under the same id would otherwise find the old scope and limits there.
DELETE_OPTIONS = "DELETE FROM run_discovery WHERE run_id = %(run)s"
KEYS_A_BATCH = 500


@dataclass(frozen=True)
class Deleted:
    rows: int
    keys: int
    held_messages: int  # in the hold queue deleted with it (only with --force)


def run_keys_patterns(keys: Keys, run_id: str) -> list[str]:
    """SCAN patterns matching exactly the keys of one run, and no other run's: a dedup hash's
    tag is the run and two hex digits, glob characters in the id are escaped."""
    run = "".join(f"\\{c}" if c in "*?[]\\" else c for c in run_id)
    return [
        keys.run_stats(run),
        keys.run_state(run),
        keys.run_seeded(run),
        keys.run_producing(run),
        keys.run_discovery(run),  # a discovery run's: its options, hosts' counts, frontiers' marks
        keys.run_discovered_hosts(run),
        keys.run_frontier(run),
        keys.producer_heartbeat(run, "*"),
        keys.producer_heartbeat(run, "*", "??"),  # one per bucket group on a Redis Cluster
        keys.seen(run, "??") + "*",  # the run's 65,536 dedup hashes
    ]


def work_left(settings: Settings, client: redis.Redis, keys: Keys, run_id: str) -> tuple[int, int]:
    """(URLs enqueued and not yet accounted for, messages in the run's hold queue)."""
    left = max(0, recorded_enqueued(client, keys, run_id) - account(settings, run_id).accounted)
    return left, held_messages(settings, run_id)


def delete_run(settings: Settings, client: redis.Redis, keys: Keys, run_id: str, *, force: bool) -> Deleted:
    """Delete the run's rows, keys and hold queue; ConfigError (one line) if it still has work
    and not `force`."""
    left, held = work_left(settings, client, keys, run_id)
    if (left or held) and not force:
        raise ConfigError(
            f"run {run_id!r} still has {left} URLs not yet done and {held} held messages; "
            f"cancel it first (python -m ops.runs cancel {run_id}), or delete with --force"
        )
    deleted_held = _delete_hold_queue(settings, run_id)
    db.ensure_schema(settings)
    with db.translate(settings), db.connect(settings) as conn:
        rows = sum(conn.execute(statement, {"run": run_id}).rowcount for statement in DELETE_ROWS)
        for statement in DELETE_COUNTERS:
            conn.execute(statement, {"run": run_id})
        conn.execute(DELETE_OPTIONS, {"run": run_id})
        conn.commit()
    return Deleted(rows, _delete_keys(client, keys, run_id), deleted_held)


def held_messages(settings: Settings, run_id: str) -> int:
    """Messages in the run's hold queue; 0 when it has none."""
    connection = broker.connect(settings, "runs delete")
    try:
        try:
            return int(
                connection.channel()
                .queue_declare(held_queue(settings.crawl_namespace, run_id), passive=True)
                .method.message_count
            )
        except pika.exceptions.ChannelClosedByBroker:  # never paused: no hold queue
            return 0
    finally:
        if connection.is_open:
            connection.close()


def _delete_hold_queue(settings: Settings, run_id: str) -> int:
    queue = held_queue(settings.crawl_namespace, run_id)
    connection = broker.connect(settings, "runs delete")
    try:
        try:
            return int(connection.channel().queue_delete(queue).method.message_count)
        except pika.exceptions.AMQPError as exc:
            raise ConfigError(f"RabbitMQ refused to delete {queue}: {exc}") from None
    finally:
        if connection.is_open:
            connection.close()


def _delete_keys(client: redis.Redis, keys: Keys, run_id: str) -> int:
    """One key per command, so that keys of different slots of a Redis Cluster can go together."""
    deleted = 0
    with translate_redis_errors(client):
        found = {
            key
            for pattern in run_keys_patterns(keys, run_id)
            for key in client.scan_iter(pattern, count=1000)
        }
        batch = sorted(found)
        for start in range(0, len(batch), KEYS_A_BATCH):
            with client.pipeline(transaction=False) as pipe:
                for key in batch[start : start + KEYS_A_BATCH]:
                    pipe.delete(key)
                deleted += sum(int(n) for n in pipe.execute())
    return deleted
