"""python -m ops.runs against the real broker, Redis and database, with no worker: what pause,
resume and cancel do to the state, the hold queue and the accounting."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from ops.accounting import account
from ops.runs import cancel, held_count, pause, resume
from shared.amqp import broker
from shared.amqp.topology import build_topology, defer_queue, work_queue
from shared.consumer import Delivery
from shared.messages import CrawlTask, Progress
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import held_exchange, held_queue, read_state
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.fakes import FakeRunStates
from worker.fetch.cache import ResponseCache
from worker.handler import CrawlHandler
from worker.handling.forwards import HOLD_UNROUTABLE_WAIT_S

RUN = "it-runs"


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, OPERATOR)
    made.hset(Keys(settings.redis_prefix).run_stats(RUN), "enqueued.bulk", 3)
    yield made
    made.close()
    connection = broker.connect(settings, "test cleanup")
    channel = connection.channel()
    channel.queue_delete(held_queue(settings.crawl_namespace, RUN))
    channel.exchange_delete(held_exchange(settings.crawl_namespace))
    connection.close()


def hold(settings: Settings, *tasks: CrawlTask) -> None:
    """What a worker does with a paused run's messages."""
    connection = broker.connect(settings, "test worker")
    broker.declare_topology(connection, build_topology(settings))
    channel = broker.confirm_channel(connection)
    for task in tasks:
        broker.publish(
            channel,
            broker.Publication(
                held_exchange(settings.crawl_namespace),
                RUN,
                task.encode(),
                Progress(attempt=1).to_headers(),
                task.priority or None,
            ),
        )
    connection.close()


def take_all(settings: Settings, queue: str) -> list[tuple[CrawlTask, int, int | None]]:
    """(task, attempt header, priority) of each message in `queue`, emptying it."""
    connection = broker.connect(settings, "test reader")
    channel = connection.channel()
    taken = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        taken.append(
            (
                CrawlTask.decode(body),
                Progress.from_headers(properties.headers or {}).attempt,
                properties.priority,
            )
        )
    connection.close()
    return taken


def tasks() -> list[CrawlTask]:
    return [
        CrawlTask(url="https://a.test/1", run_id=RUN, queue="bulk"),
        CrawlTask(url="https://a.test/2", run_id=RUN, queue="ttl"),
        CrawlTask(url="https://a.test/3", run_id=RUN, queue="priority", priority=4),
    ]


def test_resume_moves_held_messages_back_to_their_own_queues(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    pause(settings, client, keys, RUN)
    assert read_state(client, keys, RUN) == "paused"
    hold(settings, *tasks())

    assert resume(settings, client, keys, RUN) == 3
    assert read_state(client, keys, RUN) == "running"
    ns = settings.crawl_namespace
    assert [(t.url, a, p) for t, a, p in take_all(settings, work_queue(ns, "bulk"))] == [
        ("https://a.test/1", 1, None)
    ]
    assert [t.url for t, _, _ in take_all(settings, work_queue(ns, "ttl"))] == ["https://a.test/2"]
    assert [(t.url, p) for t, _, p in take_all(settings, work_queue(ns, "priority"))] == [
        ("https://a.test/3", 4)
    ]
    connection = broker.connect(settings, "test")
    with pytest.raises(Exception, match="NOT_FOUND"):  # the empty hold queue is gone
        connection.channel().queue_declare(held_queue(ns, RUN), passive=True)
    connection.close()


def test_cancel_records_held_messages_as_skips(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    pause(settings, client, keys, RUN)
    hold(settings, *tasks())
    assert cancel(settings, client, keys, RUN) == 3
    assert read_state(client, keys, RUN) == "cancelled"
    a = account(settings, RUN)
    assert (a.stored, a.dead, a.skips_by_reason) == (0, 0, {"cancelled": 3})
    with db.connect(settings, autocommit=True) as conn:
        urls = [
            row[0] for row in conn.execute("SELECT url FROM skips WHERE run_id = %s ORDER BY url", (RUN,))
        ]
    assert urls == ["https://a.test/1", "https://a.test/2", "https://a.test/3"]
    assert cancel(settings, client, keys, RUN) == 0  # again: nothing held, nothing counted twice


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.runs", *args],
        env=service_env(settings),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_mistakes_get_one_line_and_exit_2(settings: Settings, client: redis.Redis) -> None:
    unknown = cli(settings, "pause", "no-such-run")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        f"runs: error: run 'no-such-run': no such run under REDIS_PREFIX={settings.redis_prefix!r} "
        "(see python -m ops.runs list)"
    ]
    client.set(Keys(settings.redis_prefix).run_state(RUN), "cancelled")
    again = cli(settings, "resume", RUN)
    assert again.returncode == 2
    assert "was cancelled" in again.stderr and "Traceback" not in again.stderr


def test_list_and_show_name_the_run_and_its_state(settings: Settings, client: redis.Redis) -> None:
    db.ensure_schema(settings)
    client.set(Keys(settings.redis_prefix).run_state(RUN), "paused")
    listed = cli(settings, "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(RUN))
    assert row.split() == [RUN, "paused", "3", "0", "0", "0", "3"]
    shown = cli(settings, "show", RUN)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"run {RUN}: paused")


@pytest.fixture
def quorum(settings: Settings) -> Settings:
    """The same names, with quorum queues (they work on a single node)."""
    return dataclasses.replace(settings, queue_type="quorum")


def test_resume_and_cancel_work_on_quorum_queues(quorum: Settings, client: redis.Redis) -> None:
    keys = Keys(quorum.redis_prefix)
    ns = quorum.crawl_namespace
    pause(quorum, client, keys, RUN)
    hold(quorum, *tasks())
    assert resume(quorum, client, keys, RUN) == 3
    assert sorted(
        t.url for q in ("bulk", "ttl", "priority") for t, _, _ in take_all(quorum, work_queue(ns, q))
    ) == [
        "https://a.test/1",
        "https://a.test/2",
        "https://a.test/3",
    ]
    assert held_count(quorum, RUN) == 0  # the hold queue is gone

    pause(quorum, client, keys, RUN)
    hold(quorum, *tasks())
    assert cancel(quorum, client, keys, RUN) == 3
    a = account(quorum, RUN)
    assert (a.stored, a.dead, a.skips_by_reason) == (0, 0, {"cancelled": 3})
    assert held_count(quorum, RUN) == 0


def test_cancel_does_not_count_a_stored_url_again_as_a_skip(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    db.ensure_schema(settings)
    with db.connect(settings) as conn:
        conn.execute(
            "INSERT INTO pages (run_id, url, final_url, http_status, content_type, body_text, links, queue,"
            " failed_attempts, from_cache, worker_id) VALUES (%s, %s, %s, 200, 'text/html', '', '[]',"
            " 'bulk', 0, false, 'w')",
            (RUN, "https://a.test/1", "https://a.test/1"),
        )
        conn.commit()
    pause(settings, client, keys, RUN)
    hold(settings, *tasks(), tasks()[1])  # a copy of the stored URL among them, and one held twice
    assert cancel(settings, client, keys, RUN) == 2
    a = account(settings, RUN)
    assert (a.stored, a.dead, a.skips_by_reason) == (1, 0, {"cancelled": 2})
    assert a.accounted == 3


def test_a_hold_with_no_queue_bound_goes_to_a_defer_queue_and_the_channel_stays_open(
    settings: Settings, client: redis.Redis
) -> None:
    """A worker still seeing `paused` after `resume` removed the hold queue: its message comes
    back through a defer queue instead of being refused, or closing the channel."""
    ns = settings.crawl_namespace
    topology = build_topology(settings)
    handler = CrawlHandler(
        settings=settings,
        topology=topology,
        fetch=None,  # type: ignore[arg-type]
        cache=ResponseCache.from_settings(client, settings),
        gate=None,  # type: ignore[arg-type]
        robots=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        run_states=FakeRunStates(**{RUN: "paused"}),
    )
    task = CrawlTask(url="https://a.test/late", run_id=RUN, queue="bulk")
    held = Delivery(work_queue(ns, "bulk"), task.encode(), Progress(attempt=1).to_headers(), False)
    outcome = handler(held)
    connection = broker.connect(settings, "test worker")
    broker.declare_topology(connection, topology)  # the held exchange is in every service's topology
    channel = broker.confirm_channel(connection)
    for publication in outcome.publications:
        broker.publish(channel, publication)
    with pytest.raises(broker.PublishFailed):  # without a way out, unroutable is still refused
        broker.publish(channel, broker.Publication(held_exchange(ns), RUN, task.encode()))
    assert channel.is_open
    connection.close()
    delay = topology.defer_delay_ms_for(HOLD_UNROUTABLE_WAIT_S)
    deferred = take_all(settings, defer_queue(ns, delay))
    assert [(t.url, attempt) for t, attempt, _ in deferred] == [("https://a.test/late", 1)]


def test_a_broker_refusal_while_resuming_is_one_line_and_exit_2(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    pause(settings, client, keys, RUN)
    connection = broker.connect(settings, "test")
    channel = connection.channel()
    channel.exchange_delete(held_exchange(settings.crawl_namespace))
    channel.exchange_declare(held_exchange(settings.crawl_namespace), "fanout", durable=True)  # not direct
    connection.close()
    refused = cli(settings, "resume", RUN)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1
    hold_queue = held_queue(settings.crawl_namespace, RUN)
    assert refused.stderr.startswith(
        f"runs: error: RabbitMQ refused to empty {hold_queue}: PRECONDITION_FAILED"
    )


def test_a_broker_refusal_while_pausing_is_one_line_and_exit_2(
    settings: Settings, client: redis.Redis
) -> None:
    connection = broker.connect(settings, "test")
    connection.channel().exchange_declare(held_exchange(settings.crawl_namespace), "fanout", durable=True)
    connection.close()
    refused = cli(settings, "pause", RUN)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    hold_queue = held_queue(settings.crawl_namespace, RUN)
    assert refused.stderr.startswith(
        f"runs: error: RabbitMQ refused to declare {hold_queue}: PRECONDITION_FAILED"
    )
    assert read_state(client, Keys(settings.redis_prefix), RUN) == "running"


def test_a_broker_refusal_while_showing_is_one_line_and_exit_2_not_zero_held(
    settings: Settings, client: redis.Redis
) -> None:
    db.ensure_schema(settings)
    hold_queue = held_queue(settings.crawl_namespace, RUN)
    owner = broker.connect(settings, "test")
    owner.channel().queue_declare(hold_queue, exclusive=True)  # locked to every other connection
    try:
        refused = cli(settings, "show", RUN)
    finally:
        owner.close()
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(
        f"runs: error: RabbitMQ refused to count the messages in {hold_queue}: RESOURCE_LOCKED"
    )
