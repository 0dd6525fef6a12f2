"""Outcome.hold against the real broker: the message stays unacked in the process, comes back to
a handler with its memo, frees the handler thread meanwhile, and goes back to the queue when the
consumer stops. The same for a message parked as it comes, before any handler sees it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shared.amqp.topology import work_queue
from shared.consumer import Delivery, Outcome, Subscription
from shared.settings import Settings
from tests.integration.test_consumer import consume_in_thread, depth, publish_tasks, wait_for


def test_a_held_message_comes_back_with_its_memo_and_does_not_block_its_thread(settings: Settings) -> None:
    queue = work_queue(settings.crawl_namespace, "bulk")
    publish_tasks(settings, "bulk", [b"held", b"quick"])
    calls: list[tuple[bytes, object, float]] = []
    lock = threading.Lock()

    def handler(delivery: Delivery) -> Outcome:
        with lock:
            calls.append((delivery.body, delivery.memo, time.monotonic()))
        if delivery.body == b"held" and delivery.memo is None:
            return Outcome.hold(1.0, memo="slot 7")
        return Outcome.done()

    # One handler thread: "quick" can only be handled while "held" waits if the thread is free.
    consume_until_settled(settings, queue, handler, lambda: len(calls) == 3)
    assert [(body, memo) for body, memo, _ in calls] == [
        (b"held", None),
        (b"quick", None),
        (b"held", "slot 7"),
    ]
    assert calls[2][2] - calls[0][2] >= 0.95
    assert depth(settings, queue) == 0  # both acked, nothing given back


def test_a_stopping_consumer_gives_its_held_messages_back_to_the_queue(settings: Settings) -> None:
    queue = work_queue(settings.crawl_namespace, "bulk")
    publish_tasks(settings, "bulk", [f"m{i}".encode() for i in range(3)])
    held: list[bytes] = []
    lock = threading.Lock()

    def handler(delivery: Delivery) -> Outcome:
        with lock:
            held.append(delivery.body)
        return Outcome.hold(600.0)  # far longer than the test

    stop, thread = consume_in_thread(settings, [Subscription(queue)], handler, concurrency=2)
    wait_for(lambda: len(held) == 3)
    started = time.monotonic()
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.monotonic() - started < 10
    assert depth(settings, queue) == 3


def test_a_parked_message_reaches_a_handler_only_when_due_with_its_memo(settings: Settings) -> None:
    queue = work_queue(settings.crawl_namespace, "bulk")
    publish_tasks(settings, "bulk", [b"parked", b"direct", b"wrong"])
    calls: list[tuple[bytes, object, float]] = []
    lock = threading.Lock()
    came: dict[bytes, float] = {}

    def park(delivery: Delivery) -> Outcome | None:
        came[delivery.body] = time.monotonic()
        if delivery.body == b"parked":
            return Outcome.hold(1.0, memo="parked at 0")
        if delivery.body == b"wrong":
            raise RuntimeError("a bug in the hook")  # the message goes to a handler as usual
        return None

    def handler(delivery: Delivery) -> Outcome:
        with lock:
            calls.append((delivery.body, delivery.memo, time.monotonic()))
        return Outcome.done()

    consume_until_settled(settings, queue, handler, lambda: len(calls) == 3, park=park)
    assert sorted((body, memo) for body, memo, _ in calls) == [
        (b"direct", None),
        (b"parked", "parked at 0"),
        (b"wrong", None),
    ]
    assert [body for body, _, _ in calls][-1] == b"parked"  # handled once, after the others
    handled_at = {body: at for body, _, at in calls}
    assert handled_at[b"parked"] - came[b"parked"] >= 0.95
    assert depth(settings, queue) == 0  # all three acked


def test_a_stopping_consumer_gives_its_parked_messages_back_to_the_queue(settings: Settings) -> None:
    queue = work_queue(settings.crawl_namespace, "bulk")
    publish_tasks(settings, "bulk", [f"m{i}".encode() for i in range(3)])
    parked: list[bytes] = []
    handled: list[bytes] = []

    def park(delivery: Delivery) -> Outcome | None:
        parked.append(delivery.body)
        return Outcome.hold(600.0)  # far longer than the test

    stop, thread = consume_in_thread(settings, [Subscription(queue)], handled_by(handled), park=park)
    wait_for(lambda: len(parked) == 3)
    started = time.monotonic()
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.monotonic() - started < 10
    assert handled == []  # given back unhandled
    assert depth(settings, queue) == 3


def handled_by(handled: list[bytes]) -> Callable[[Delivery], Outcome]:
    def handler(delivery: Delivery) -> Outcome:
        handled.append(delivery.body)
        return Outcome.done()

    return handler


def consume_until_settled(
    settings: Settings,
    queue: str,
    handler: Callable[[Delivery], Outcome],
    done: Callable[[], bool],
    park: Callable[[Delivery], Outcome | None] | None = None,
) -> None:
    """Consume `queue` on one handler thread until `done()` and every message is acked."""
    stop, thread = consume_in_thread(settings, [Subscription(queue)], handler, concurrency=1, park=park)
    try:
        wait_for(done)
        wait_for(lambda: depth(settings, queue) == 0)
    finally:
        stop.set()
        thread.join(timeout=30)
