"""Deferrals and retries through the real broker: each through delay queues of its own, and back
to the queue the URL came from after the delay."""

from __future__ import annotations

import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from shared.amqp import broker
from shared.amqp.topology import (
    DEFERRAL_DELAYS_S,
    build_topology,
    defer_exchange,
    defer_queue,
    delay_queue,
    delay_routing_key,
    retry_exchange,
    work_queue,
)
from shared.messages import CrawlTask
from shared.settings import Settings


def declared(settings: Settings) -> pika.BlockingConnection:
    connection = broker.connect(settings, "test-defer")
    broker.declare_topology(connection, build_topology(settings))
    return connection


def wait_for_depth(channel: BlockingChannel, queue: str, depth: int, within_s: float = 20) -> None:
    deadline = time.monotonic() + within_s
    while broker.queue_depth(channel, queue)[0] != depth:
        assert time.monotonic() < deadline, f"{queue} never held {depth} message(s)"
        time.sleep(0.1)


def test_the_defer_queues_are_declared_apart_from_the_retry_queues(settings: Settings) -> None:
    topology = build_topology(settings)
    ns = settings.crawl_namespace
    names = {q.name for q in topology.queues}

    assert {defer_queue(ns, int(s * 1000)) for s in DEFERRAL_DELAYS_S} <= names
    # The test settings retry after 0.5 s and 1 s; the deferral lengths add no retry queue.
    assert {n for n in names if n.startswith(f"{ns}.retry.")} == {delay_queue(ns, 500), delay_queue(ns, 1000)}

    connection = declared(settings)
    channel = connection.channel()
    for name in names:
        assert broker.queue_depth(channel, name) == (0, 0)  # each exists
    connection.close()


@pytest.mark.parametrize("kind", ["bulk", "priority"])
def test_a_deferred_url_waits_in_a_defer_queue_then_returns_to_its_own_queue(
    settings: Settings, kind: str
) -> None:
    ns = settings.crawl_namespace
    topology = build_topology(settings)
    delay_ms = topology.defer_delay_ms_for(0.2)
    connection = declared(settings)
    channel = broker.confirm_channel(connection)
    body = CrawlTask(url="https://example.com/later", run_id="r", queue=kind).encode()

    broker.publish(
        channel,
        broker.Publication(defer_exchange(ns), delay_routing_key(delay_ms, kind), body, {"crawl-attempt": 1}),
    )

    wait_for_depth(channel, work_queue(ns, kind), 1)
    method, properties, returned = channel.basic_get(work_queue(ns, kind), auto_ack=True)
    assert method is not None and returned == body
    assert properties.headers["crawl-attempt"] == 1  # the attempt count travels unchanged
    for retry_ms in topology.delays_ms:
        assert broker.queue_depth(channel, delay_queue(ns, retry_ms))[0] == 0
    for other in ("bulk", "priority", "ttl"):
        assert broker.queue_depth(channel, work_queue(ns, other))[0] == 0
    connection.close()


def test_a_retried_url_goes_through_a_retry_queue_not_a_defer_queue(settings: Settings) -> None:
    ns = settings.crawl_namespace
    topology = build_topology(settings)
    connection = declared(settings)
    channel = broker.confirm_channel(connection)
    body = CrawlTask(url="https://example.com/failed", run_id="r", queue="bulk").encode()

    broker.publish(channel, broker.Publication(retry_exchange(ns), delay_routing_key(500, "bulk"), body))

    # Seen in its retry queue (or already back), never in a defer queue.
    deadline = time.monotonic() + 20
    while broker.queue_depth(channel, work_queue(ns, "bulk"))[0] != 1:
        assert time.monotonic() < deadline, "the retried URL never came back"
        for defer_ms in topology.defer_delays_ms:
            assert broker.queue_depth(channel, defer_queue(ns, defer_ms))[0] == 0
        time.sleep(0.05)
    connection.close()
