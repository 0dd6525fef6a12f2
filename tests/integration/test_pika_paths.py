"""pika's private parts and their public fallbacks (shared/amqp/pika_compat.py) against the real
broker: the publisher sends the same messages, the consumer gives the same acks, either way."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from producer.publisher import ConfirmingPublisher
from shared.amqp import broker, pika_compat
from shared.amqp.broker import Publication
from shared.amqp.topology import (
    build_topology,
    dead_letter_queue,
    new_task_routing_key,
    work_exchange,
    work_queue,
)
from shared.consumer import Delivery, Outcome, Subscription
from shared.settings import Settings
from tests.integration.test_consumer import consume_in_thread, depth, publish_tasks, wait_for


@pytest.fixture(params=[True, False], ids=["private_api", "public_api"])
def private_api(request: pytest.FixtureRequest) -> bool:
    wanted: bool = request.param
    if wanted:  # the private path must be the one in use where it is wanted
        assert pika_compat.private_parts_checked() is None
    return wanted


def drain(settings: Settings, queue: str) -> list[tuple[bytes, dict[str, Any], int | None, int]]:
    """Every message in `queue`: body, headers, priority and delivery mode, in queue order."""
    connection = broker.connect(settings, "test-drain")
    channel = connection.channel()
    found = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        found.append((body, properties.headers or {}, properties.priority, properties.delivery_mode))
    connection.close()
    return found


def test_the_publisher_sends_the_same_messages_either_way(settings: Settings, private_api: bool) -> None:
    connection = broker.connect(settings, "test")
    broker.declare_topology(connection, build_topology(settings))
    connection.close()
    exchange = work_exchange(settings.crawl_namespace)
    key = new_task_routing_key("bulk")
    sent = [
        Publication(exchange, key, b'{"n": 1}'),
        Publication(exchange, key, b"", headers={"attempt": 2}),
        Publication(exchange, key, b"x" * 400_000, priority=1),  # past pika's 128 KiB frames
        Publication(exchange, "new.nowhere", b"{}"),  # unroutable: returned, so False
        Publication(exchange, key, b'{"n": 2}', headers={"a": "b", "list": [1, 2]}),
    ]
    with ConfirmingPublisher(settings, private_api=private_api) as publisher:
        publisher.start()
        assert publisher.sends_own_frames is private_api
        assert publisher.publish_batch(sent) == [True, True, True, False, True]
        assert publisher.publish_batch([sent[0]] * 300) == [True] * 300
    routed = [p for p in sent if p.routing_key == key] + [sent[0]] * 300
    expected = [(p.body, dict(p.headers), p.priority, 2) for p in routed]
    assert drain(settings, work_queue(settings.crawl_namespace, "bulk")) == expected


def test_the_consumer_acks_and_rejects_the_same_either_way(settings: Settings, private_api: bool) -> None:
    bodies = [f"m{i}".encode() for i in range(60)]
    publish_tasks(settings, "bulk", bodies)
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(delivery: Delivery) -> Outcome:
        with lock:
            seen.append(delivery.body)
        number = int(delivery.body[1:])
        return Outcome.reject(requeue=False) if number % 10 == 0 else Outcome.done()

    ns = settings.crawl_namespace
    stop, thread = consume_in_thread(
        settings, [Subscription(work_queue(ns, "bulk"))], handler, private_api=private_api
    )
    wait_for(lambda: len(seen) == 60)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    # Each message handled once: an ack lost would have brought it back to the queue when the
    # consumer's connection closed.
    assert sorted(seen) == sorted(bodies)
    assert depth(settings, work_queue(ns, "bulk")) == 0
    assert depth(settings, dead_letter_queue(ns)) == 6
