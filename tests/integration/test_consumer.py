"""The shared consumer loop against the real broker."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

from shared.amqp import broker
from shared.amqp.topology import (
    build_topology,
    dead_letter_queue,
    new_task_routing_key,
    work_exchange,
    work_queue,
)
from shared.consumer import ConsumerHooks, Delivery, Outcome, StopEvent, Subscription, run_consumers
from shared.errors import ServiceUnavailable
from shared.settings import Settings


def publish_tasks(settings: Settings, kind: str, bodies: list[bytes], priority: int | None = None) -> None:
    connection = broker.connect(settings, "test-publisher")
    broker.declare_topology(connection, build_topology(settings))
    channel = broker.confirm_channel(connection)
    for body in bodies:
        broker.publish(
            channel,
            broker.Publication(
                work_exchange(settings.crawl_namespace), new_task_routing_key(kind), body, priority=priority
            ),
        )
    connection.close()


def depth(settings: Settings, queue: str) -> int:
    connection = broker.connect(settings, "test-depth")
    ready, _ = broker.queue_depth(connection.channel(), queue)
    connection.close()
    return ready


def consume_in_thread(
    settings: Settings,
    subscriptions: list[Subscription],
    handler: Callable[[Delivery], Outcome],
    concurrency: int = 2,
    when_idle: Callable[[], None] | None = None,
    private_api: bool = True,
    park: Callable[[Delivery], Outcome | None] | None = None,
    when_quiet: Callable[[], None] | None = None,
) -> tuple[StopEvent, threading.Thread]:
    stop = StopEvent()
    thread = threading.Thread(
        target=run_consumers,
        args=(settings, "test-consumer", subscriptions, handler, concurrency),
        kwargs={
            "stop_event": stop,
            "hooks": ConsumerHooks(park=park, when_idle=when_idle, when_quiet=when_quiet),
            "private_api": private_api,
        },
        daemon=True,
    )
    thread.start()
    return stop, thread


def wait_for(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_every_message_is_handled_once_and_acked(settings: Settings) -> None:
    bodies = [f"m{i}".encode() for i in range(50)]
    publish_tasks(settings, "bulk", bodies)
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(delivery: Delivery) -> Outcome:
        with lock:
            seen.append(delivery.body)
        return Outcome.done()

    ns = settings.crawl_namespace
    stop, thread = consume_in_thread(settings, [Subscription(work_queue(ns, "bulk"))], handler)
    wait_for(lambda: len(seen) == 50)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert sorted(seen) == sorted(bodies)
    assert depth(settings, work_queue(ns, "bulk")) == 0


def test_priority_queue_is_served_first(settings: Settings) -> None:
    ns = settings.crawl_namespace
    publish_tasks(settings, "bulk", [b"bulk"] * 5)
    publish_tasks(settings, "priority", [b"urgent"] * 5, priority=5)
    order: list[bytes] = []

    def handler(delivery: Delivery) -> Outcome:
        order.append(delivery.body)
        time.sleep(0.02)
        return Outcome.done()

    subscriptions = [Subscription(work_queue(ns, "priority"), 10), Subscription(work_queue(ns, "bulk"))]
    stop, thread = consume_in_thread(settings, subscriptions, handler, concurrency=1)
    wait_for(lambda: len(order) == 10)
    stop.set()
    thread.join(timeout=30)
    # One handler thread; the first delivery may race the priority consumer's start.
    assert order[1:6].count(b"urgent") >= 4


def test_handler_bug_dead_letters_instead_of_looping(settings: Settings) -> None:
    ns = settings.crawl_namespace
    publish_tasks(settings, "bulk", [b"poison"])
    calls: list[bytes] = []

    def handler(delivery: Delivery) -> Outcome:
        calls.append(delivery.body)
        raise RuntimeError("bug")

    stop, thread = consume_in_thread(settings, [Subscription(work_queue(ns, "bulk"))], handler)
    wait_for(lambda: depth(settings, dead_letter_queue(ns)) == 1)
    stop.set()
    thread.join(timeout=30)
    assert calls == [b"poison"]


def test_stop_returns_unfinished_messages_to_the_queue(settings: Settings) -> None:
    ns = settings.crawl_namespace
    publish_tasks(settings, "bulk", [b"x"] * 20)
    started = threading.Event()
    handled: list[bytes] = []

    def slow_handler(delivery: Delivery) -> Outcome:
        started.set()
        time.sleep(0.5)
        handled.append(delivery.body)
        return Outcome.done()

    stop, thread = consume_in_thread(settings, [Subscription(work_queue(ns, "bulk"))], slow_handler, 2)
    started.wait(10)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert 1 <= len(handled) < 20
    wait_for(lambda: depth(settings, work_queue(ns, "bulk")) == 20 - len(handled))


def test_a_handler_thread_out_of_messages_runs_the_idle_hook_first(settings: Settings) -> None:
    ns = settings.crawl_namespace
    publish_tasks(settings, "bulk", [b"one", b"two", b"three"])
    events: list[tuple[str, str]] = []  # (what, thread name), in order
    lock = threading.Lock()

    def handler(delivery: Delivery) -> Outcome:
        with lock:
            events.append((delivery.body.decode(), threading.current_thread().name))
        return Outcome.done()

    def when_idle() -> None:
        with lock:
            events.append(("idle", threading.current_thread().name))
        raise RuntimeError("an idle hook that fails leaves the thread working")

    stop, thread = consume_in_thread(
        settings, [Subscription(work_queue(ns, "bulk"))], handler, concurrency=1, when_idle=when_idle
    )
    wait_for(lambda: sum(what != "idle" for what, _ in events) == 3)
    publish_tasks(settings, "bulk", [b"four"])
    wait_for(lambda: any(what == "four" for what, _ in events))
    stop.set()
    thread.join(timeout=30)
    handled = [what for what, _ in events if what != "idle"]
    assert sorted(handled) == ["four", "one", "three", "two"]
    # One handler thread: it ran the hook, on itself, each time it found nothing waiting,
    # which it must have between the first three messages and the fourth.
    assert {name for _, name in events} == {"test-consumer-0"}
    before_four = [what for what, _ in events][: [what for what, _ in events].index("four")]
    assert before_four[-1] == "idle"
    assert depth(settings, work_queue(ns, "bulk")) == 0


def test_the_quiet_hook_runs_only_with_nothing_else_in_hand(settings: Settings) -> None:
    # "slow" keeps one thread handling; "later" leaves its outcome pending on another thread (as
    # a row waits for the worker's commit), which is not in hand; "held" waits in the timer heap.
    ns = settings.crawl_namespace
    queue = work_queue(ns, "bulk")
    events: list[str] = []
    lock = threading.Lock()
    release_slow = threading.Event()
    pending: list[concurrent.futures.Future[None]] = []

    def record(what: str) -> None:
        with lock:
            events.append(what)

    def handler(delivery: Delivery) -> Outcome:
        if delivery.memo == "reported":  # back with its report: settled at once
            return Outcome.done()
        record(delivery.body.decode())
        if delivery.body == b"slow":
            release_slow.wait(20)
            record("slow-done")
        if delivery.body == b"later":
            pending.append(concurrent.futures.Future())
            return Outcome.back_when(pending[-1], "reported")
        if delivery.body == b"held":
            return Outcome.hold(3600)
        return Outcome.done()

    def after(mark: str) -> list[str]:
        with lock:
            return events[events.index(mark) + 1 :] if mark in events else []

    stop, thread = consume_in_thread(
        settings,
        [Subscription(queue)],
        handler,
        concurrency=2,
        when_idle=lambda: record("idle"),
        when_quiet=lambda: record("quiet"),
    )
    try:
        publish_tasks(settings, "bulk", [b"slow"])
        wait_for(lambda: "slow" in events)
        publish_tasks(settings, "bulk", [b"later"])
        wait_for(lambda: "idle" in after("later"))  # the other thread is done with it and idle
        assert "quiet" not in after("slow")  # "slow" is still in hand
        release_slow.set()
        wait_for(lambda: "quiet" in after("slow-done"))  # the last thread out found nothing else
        publish_tasks(settings, "bulk", [b"held"])
        wait_for(lambda: "idle" in after("held"))
        time.sleep(0.5)
        assert "quiet" not in after("held")  # it waits in this service's timer heap
    finally:
        release_slow.set()
        for report in pending:  # reported, so the stop need not wait for it
            report.set_result(None)
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_stopping_service_with_nothing_else_in_hand_runs_the_quiet_hook(settings: Settings) -> None:
    # The hook settles what waits (as the worker's writer commits its rows), but only once the
    # stop has come: the stop itself must call it, or the message waits out the drain and goes
    # back to its queue.
    ns = settings.crawl_namespace
    queue = work_queue(ns, "bulk")
    publish_tasks(settings, "bulk", [b"later"])
    settled: concurrent.futures.Future[None] = concurrent.futures.Future()
    handled = threading.Event()
    stop = StopEvent()

    def handler(delivery: Delivery) -> Outcome:
        if delivery.memo == "reported":  # back with its report, after the stop: decided all the same
            return Outcome.done()
        handled.set()
        return Outcome.back_when(settled, "reported")

    def when_quiet() -> None:
        if stop.is_set() and not settled.done():
            settled.set_result(None)

    thread = threading.Thread(
        target=run_consumers,
        args=(settings, "test-consumer", [Subscription(queue)], handler, 2),
        kwargs={"stop_event": stop, "hooks": ConsumerHooks(when_quiet=when_quiet)},
        daemon=True,
    )
    thread.start()
    assert handled.wait(20)
    time.sleep(0.2)  # the handler thread is idle again: it found the service quiet before the stop
    assert not settled.done()
    stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert settled.done()
    assert depth(settings, queue) == 0  # acked in the drain, not given back


def test_a_message_back_with_its_report_is_acked_requeued_or_dead_lettered_as_its_handler_decides(
    settings: Settings,
) -> None:
    # Two handler threads take all three messages and leave them waiting for a report (the
    # prefetch, twice the threads, bounds what is in hand); the test resolves the reports from
    # its own thread, as the worker's database writer does, and each message comes back to the
    # handler, which decides from its report.
    ns = settings.crawl_namespace
    queue = work_queue(ns, "bulk")
    publish_tasks(settings, "bulk", [b"ack", b"requeue", b"dead"])
    pending: dict[bytes, concurrent.futures.Future[None]] = {}
    deliveries: list[tuple[bytes, bool]] = []
    lock = threading.Lock()

    def handler(delivery: Delivery) -> Outcome:
        if isinstance(delivery.memo, concurrent.futures.Future):  # back with its report
            error = delivery.memo.exception(timeout=0)
            if error is None:
                return Outcome.done()
            return Outcome.reject(requeue=isinstance(error, ServiceUnavailable))
        report: concurrent.futures.Future[None] = concurrent.futures.Future()
        with lock:
            deliveries.append((delivery.body, delivery.redelivered))
            pending[delivery.body] = report
        return Outcome.back_when(report, report)

    stop, thread = consume_in_thread(settings, [Subscription(queue)], handler, concurrency=2)
    wait_for(lambda: len(pending) == 3)  # two threads, three messages in hand: none waited
    assert depth(settings, queue) == 0  # all three delivered and unacked
    with lock:
        first = dict(pending)
        pending.clear()
    first[b"ack"].set_result(None)
    first[b"requeue"].set_exception(ServiceUnavailable("PostgreSQL", "db", "down"))
    first[b"dead"].set_exception(RuntimeError("bug"))
    wait_for(lambda: b"requeue" in pending)  # back in the queue, and delivered again
    pending[b"requeue"].set_result(None)
    wait_for(lambda: depth(settings, dead_letter_queue(ns)) == 1)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert sorted(deliveries) == [(b"ack", False), (b"dead", False), (b"requeue", False), (b"requeue", True)]
    assert depth(settings, queue) == 0
