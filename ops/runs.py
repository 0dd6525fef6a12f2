"""python -m ops.runs list | show RUN | pause RUN | resume RUN | cancel RUN | delete RUN: runs as
things an operator handles.

- `list`: the runs Redis has counters for, with state, enqueued, stored, dead, skipped, left.
- `show RUN`: one run in detail, its held messages included.
- `pause RUN`: workers stop fetching the run's URLs. Each of its messages they take is moved,
  once, to the queue `<ns>.held.<run>` (nothing consumes it), so the messages wait without
  being fetched or bounced through the broker. Messages already being fetched finish.
- `resume RUN`: clears the state, then moves the held messages back to their work queues.
- `cancel RUN`: the run's remaining URLs end as skips with reason `cancelled`: the held ones
  here and now, the ones still queued as workers take them. A cancelled run stays cancelled.
- `delete RUN [--force]`: its rows, Redis keys and hold queue go (ops/run_delete.py); refused
  while it still has URLs queued or held, unless --force.

The state lives in Redis (shared/redis/runstate.py); workers see a change within a second, and
`resume` and `cancel` wait that second out before they touch the hold queue, so that a worker
still seeing `paused` does not refill it behind them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO

import pika
import pika.exceptions
import redis
from pika.adapters.blocking_connection import BlockingChannel

from ops.accounting import account, account_on
from ops.copies import Copies
from ops.run_delete import delete_run
from ops.run_progress import run_progress
from shared.amqp import broker
from shared.amqp.topology import CLASSIC_QUEUE_ARGUMENTS, work_exchange
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError, DecodeError
from shared.messages import CrawlTask
from shared.postgres import db
from shared.postgres.skips import UPSERT_SKIP
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.redis.runstate import (
    CANCELLED,
    MAX_AGE_S,
    PAUSED,
    RUNNING,
    held_exchange,
    held_queue,
    read_state,
    recorded_counters,
    recorded_enqueued,
    write_state,
)
from shared.settings import Settings

Held = tuple[int, pika.BasicProperties, bytes]  # delivery tag, properties, body
# Deals with a batch of held messages and acks them: (channel they came on, a confirm channel, batch).
_Settle = Callable[[BlockingChannel, BlockingChannel, list[Held]], None]
SKIP_BATCH = 500  # held messages recorded as skips per commit (and acked together after it)
CANCEL_DETAIL = "the run was cancelled by an operator"
RETURNING_NEW = " RETURNING (xmax = 0)"  # true for a row inserted, false for one rewritten
DELETE_TRIES = 5  # rounds of emptying the hold queue before giving up on deleting it
NOT_FOUND = 404  # the reply code of a passive declare of a queue that does not exist


def main(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    args = parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "runs", settings.log_format)
    client = connect_redis(settings, OPERATOR)
    keys = Keys(settings.redis_prefix)
    try:
        if args.command == "list":
            return list_runs(settings, client, keys, out)
        run_id: str = args.run
        if args.command == "delete":
            deleted = delete_run(settings, client, keys, run_id, force=args.force)
            print(
                f"run {run_id} deleted: {deleted.rows} rows, {deleted.keys} Redis keys, "
                f"{deleted.held_messages} held messages",
                file=out,
            )
            return 0
        state = read_state(client, keys, run_id)
        if state == RUNNING and not recorded_enqueued(client, keys, run_id):
            raise ConfigError(
                f"run {run_id!r}: no such run under REDIS_PREFIX={settings.redis_prefix!r} "
                "(see python -m ops.runs list)"
            )
        if args.command == "show":
            return show_run(settings, client, keys, run_id, state, out)
        if state == CANCELLED and args.command != "cancel":  # cancelling again is harmless
            raise ConfigError(f"run {run_id!r} was cancelled; it cannot be {args.command}d")
        if args.command == "pause":
            pause(settings, client, keys, run_id)
            print(
                f"run {run_id} paused: workers move its URLs to "
                f"{held_queue(settings.crawl_namespace, run_id)}",
                file=out,
            )
        elif args.command == "resume":
            moved = resume(settings, client, keys, run_id)
            print(f"run {run_id} resumed: {moved} held messages back in their work queues", file=out)
        else:
            skipped = cancel(settings, client, keys, run_id)
            print(
                f"run {run_id} cancelled: {skipped} held URLs recorded as skips (cancelled); "
                "workers skip the ones still queued as they take them",
                file=out,
            )
        return 0
    finally:
        client.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.runs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the runs with counters in Redis")
    for name, text in (
        ("show", "one run's state, totals and held messages"),
        ("pause", "stop fetching a run's URLs; they wait in its hold queue"),
        ("resume", "put a paused run's held URLs back to work"),
        ("cancel", "end a run's remaining URLs as skips with reason 'cancelled'"),
    ):
        commands.add_parser(name, help=text).add_argument("run", metavar="RUN", help="the run id")
    delete = commands.add_parser("delete", help="remove a run's rows, Redis keys and hold queue")
    delete.add_argument("run", metavar="RUN", help="the run id")
    delete.add_argument("--force", action="store_true", help="even while it has URLs queued or held")
    return parser.parse_args(argv)


def list_runs(settings: Settings, client: redis.Redis, keys: Keys, out: IO[str]) -> int:
    prefix, suffix = keys.run_stats("\0").split("\0")
    with translate_redis_errors(client):
        runs = sorted(
            key.decode()[len(prefix) : -len(suffix)]
            for key in client.scan_iter(keys.run_stats_pattern(), count=1000)
        )
    print(
        f"{'run':<32} {'state':<9} {'enqueued':>9} {'stored':>8} {'dead':>6} {'skipped':>8} {'left':>8}",
        file=out,
    )
    with db.translate(settings), db.connect(settings, autocommit=True) as conn:
        for run_id in runs:
            a = account_on(conn, run_id)
            enqueued = recorded_enqueued(client, keys, run_id)
            print(
                f"{run_id:<32} {read_state(client, keys, run_id):<9} {enqueued:>9} {a.stored:>8} "
                f"{a.dead:>6} {a.skipped:>8} {max(0, enqueued - a.accounted):>8}",
                file=out,
            )
    if not runs:
        print(f"(no runs under REDIS_PREFIX={settings.redis_prefix!r})", file=out)
    return 0


def show_run(
    settings: Settings, client: redis.Redis, keys: Keys, run_id: str, state: str, out: IO[str]
) -> int:
    a = account(settings, run_id)
    enqueued = recorded_enqueued(client, keys, run_id)
    held = held_count(settings, run_id)
    dead = ", ".join(f"{reason} {n}" for reason, n in a.dead_by_reason.items()) or "none"
    skips = ", ".join(f"{reason} {n}" for reason, n in a.skips_by_reason.items()) or "none"
    print(
        f"run {run_id}: {state}\n"
        f"  enqueued       {enqueued:8d}\n"
        f"  pages stored   {a.stored:8d}\n"
        f"  dead letters   {a.dead:8d}   ({dead})\n"
        f"  skipped        {a.skipped:8d}   ({skips})\n"
        f"  not yet done   {max(0, enqueued - a.accounted):8d}   ({held} held in "
        f"{held_queue(settings.crawl_namespace, run_id)})"
        + f"\n  {'progress':<15}{run_progress(settings, run_id, keys.prefix).line()}"
        + "".join(
            f"\n{line}" for line in Copies.from_counters(recorded_counters(client, keys, run_id)).lines(15)
        ),
        file=out,
    )
    return 0


def held_count(settings: Settings, run_id: str) -> int:
    """Messages waiting in the run's hold queue (0 when it has none)."""
    queue = held_queue(settings.crawl_namespace, run_id)
    connection = broker.connect(settings, "runs show")
    try:
        with _refusals(f"count the messages in {queue}"):
            try:
                return broker.queue_depth(connection.channel(), queue)[0]
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code == NOT_FOUND:  # never paused: no hold queue
                    return 0
                raise
    finally:
        _close(connection)


def pause(settings: Settings, client: redis.Redis, keys: Keys, run_id: str) -> None:
    """The hold queue first, then the state: a worker that sees `paused` finds the queue."""
    ns = settings.crawl_namespace
    queue = held_queue(ns, run_id)
    connection = broker.connect(settings, "runs pause")
    try:
        with _refusals(f"declare {queue}"):
            channel = connection.channel()
            channel.exchange_declare(held_exchange(ns), "direct", durable=True)
            # Replicated like the work queues on a cluster (QUEUE_TYPE=quorum); no TTL, no limit.
            arguments = (
                {"x-queue-type": "quorum"} if settings.queue_type == "quorum" else CLASSIC_QUEUE_ARGUMENTS
            )
            channel.queue_declare(queue, durable=True, arguments=arguments)
            channel.queue_bind(queue, held_exchange(ns), run_id)
    finally:
        _close(connection)
    write_state(client, keys, run_id, PAUSED)


def resume(settings: Settings, client: redis.Redis, keys: Keys, run_id: str) -> int:
    """Clear the state, wait until every worker has seen it, then move the held messages back,
    each acked only once its copy in the work queue is confirmed."""
    write_state(client, keys, run_id, RUNNING)
    time.sleep(MAX_AGE_S + 0.5)
    ns = settings.crawl_namespace
    moved = 0

    def move_back(channel: BlockingChannel, confirmed: BlockingChannel, batch: list[Held]) -> None:
        nonlocal moved
        for tag, properties, body in batch:
            kind = _task(body).queue
            broker.publish(
                confirmed,
                broker.Publication(
                    work_exchange(ns), f"held.{kind}", body, properties.headers or {}, properties.priority
                ),
            )
            channel.basic_ack(tag)
            moved += 1

    _drain_held(settings, run_id, move_back)
    return moved


def cancel(settings: Settings, client: redis.Redis, keys: Keys, run_id: str) -> int:
    """Set the state, wait until every worker has seen it, then record each held message as a
    skip with reason `cancelled`: a batch committed, then acked."""
    write_state(client, keys, run_id, CANCELLED)
    time.sleep(MAX_AGE_S + 0.5)
    recorded = 0

    def record(channel: BlockingChannel, _confirmed: BlockingChannel, batch: list[Held]) -> None:
        nonlocal recorded
        rows = [
            {
                "run_id": run_id,
                "url": _task(body).url,
                "reason": "cancelled",
                "detail": CANCEL_DETAIL,
                "worker_id": "runs",
            }
            for _tag, _properties, body in batch
        ]
        with db.translate(settings), db.connect(settings) as conn:
            with conn.cursor() as cursor:
                cursor.executemany(UPSERT_SKIP + RETURNING_NEW, rows, returning=True)
                # Skips new here: a held copy of a URL already stored, dead-lettered or skipped
                # (a second copy held, or one a worker skipped) adds none.
                written = 0
                while True:
                    written += sum(1 for (new,) in cursor.fetchall() if new)
                    if not cursor.nextset():
                        break
            conn.commit()
        channel.basic_ack(batch[-1][0], multiple=True)
        recorded += written

    db.ensure_schema(settings)
    _drain_held(settings, run_id, record)
    return recorded


def _drain_held(settings: Settings, run_id: str, settle: _Settle) -> None:
    """Take the run's hold queue apart in batches, handing each to `settle`, which must ack
    what it has dealt with; then delete the queue once it is empty. No hold queue: nothing to do.
    A broker error ends it with one line (ConfigError): what was settled stays settled, and what
    was not stays held for the next `resume` or `cancel`."""
    queue = held_queue(settings.crawl_namespace, run_id)
    connection = broker.connect(settings, "runs")
    try:
        channel = connection.channel()
        try:
            channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:  # never paused: no hold queue
            return
        confirmed = broker.confirm_channel(connection)
        _settle_all(channel, confirmed, queue, settle)
        # Unbound first, so that nothing can arrive between the last look and the delete: a
        # worker still holding after the wait gets its message back (unroutable) and sends it
        # to a defer queue; it comes back and, seeing the new state, is dealt with.
        # Declared again first: unbinding from an exchange someone deleted would close the channel.
        channel.exchange_declare(held_exchange(settings.crawl_namespace), "direct", durable=True)
        channel.queue_unbind(queue, held_exchange(settings.crawl_namespace), run_id)
        for _ in range(DELETE_TRIES):
            _settle_all(channel, confirmed, queue, settle)
            # Not queue_delete(if_empty=True): quorum queues refuse it. Emptiness is looked up
            # instead, and a copy that landed meanwhile is settled in another round.
            if channel.queue_declare(queue, passive=True).method.message_count == 0:
                channel.queue_delete(queue)
                return
        raise ConfigError(f"{queue}: messages kept arriving while it was emptied; run the command again")
    except pika.exceptions.AMQPError as exc:
        raise ConfigError(f"RabbitMQ refused to empty {queue}: {_describe(exc)}") from None
    finally:
        _close(connection)


@contextlib.contextmanager
def _refusals(action: str) -> Iterator[None]:
    """A broker error while doing `action` becomes one line (ConfigError) naming the action,
    instead of pika's exception."""
    try:
        yield
    except pika.exceptions.AMQPError as exc:
        raise ConfigError(f"RabbitMQ refused to {action}: {_describe(exc)}") from None


def _close(connection: pika.BlockingConnection) -> None:
    """Close it if the broker has not; an error in closing must not hide the one before it."""
    if connection.is_open:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()


def _settle_all(channel: BlockingChannel, confirmed: BlockingChannel, queue: str, settle: _Settle) -> None:
    while True:
        batch: list[Held] = []
        while len(batch) < SKIP_BATCH:
            method, properties, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            batch.append((method.delivery_tag, properties, body))
        if not batch:
            return
        settle(channel, confirmed, batch)


def _describe(exc: BaseException) -> str:
    reply = getattr(exc, "reply_text", None)
    text = str(reply) if reply else str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _task(body: bytes) -> CrawlTask:
    try:
        return CrawlTask.decode(body)
    except DecodeError as exc:  # a worker holds only messages it has decoded
        raise ConfigError(f"a held message does not decode: {exc.detail}") from None


if __name__ == "__main__":
    run_main("runs", main)
