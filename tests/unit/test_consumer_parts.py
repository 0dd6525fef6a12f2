"""Each part of the consumer loop built alone, with a fake connection and channel in place of
pika: the settling of outcomes, the handler threads, and the connection's thread (through its
`connect=` seam)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pika.exceptions

from shared.amqp.broker import Joining, Publication
from shared.consumer import ConsumerHooks, Delivery, Outcome, StopEvent, Subscription
from shared.consumer.connection_thread import ConnectionThread
from shared.consumer.handler_threads import HandlerThreads
from shared.consumer.local_buffer import LocalItem
from shared.consumer.settling import CurrentConnection, Settling
from shared.errors import ServiceUnavailable
from shared.settings import Settings


@dataclass
class FakeChannel:
    """A connection and its channels in one: records what the loop asks of pika."""

    acked: list[int] = field(default_factory=list)
    rejected: list[tuple[int, bool]] = field(default_factory=list)
    published: list[tuple[str, str, bytes]] = field(default_factory=list)
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    consumers: dict[str, Callable[..., None]] = field(default_factory=dict)
    consumer_tags: tuple[str, ...] = ()
    is_open: bool = True
    events: Callable[[], None] = lambda: None  # what one process_data_events does

    def basic_ack(self, tag: int) -> None:
        self.acked.append(tag)

    def basic_reject(self, tag: int, requeue: bool) -> None:
        self.rejected.append((tag, requeue))

    def basic_nack(self, tag: int, requeue: bool) -> None:
        self.rejected.append((tag, requeue))

    def basic_publish(self, exchange: str, routing_key: str, body: bytes, *_args: Any, **_kw: Any) -> None:
        self.published.append((exchange, routing_key, body))

    def basic_consume(self, queue: str, on_message: Callable[..., None], arguments: Any = None) -> None:
        self.consumers[queue] = on_message

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def process_data_events(self, time_limit: float) -> None:
        self.events()

    def close(self) -> None:
        self.is_open = False


DONE = Delivery("q", b"{}", {}, False)


def connected(channel: FakeChannel) -> CurrentConnection:
    current = CurrentConnection()
    current.use(channel, channel, channel, channel.basic_ack)
    return current


def item(current: CurrentConnection, tag: int, body: bytes = b"{}") -> LocalItem:
    current.unsettled.add(tag)
    return LocalItem(0, 0, tag, current.generation, tag, Delivery("q", body, {}, False))


def test_settling_publishes_then_acks_and_one_wake_settles_every_outcome_waiting() -> None:
    channel = FakeChannel()
    current = connected(channel)
    settling = Settling("test", current)
    forward = Outcome.forward(Publication("x", "k", b"copy"))
    settling.hand_back(item(current, 1), forward)
    settling.hand_back(item(current, 2), Outcome.reject(requeue=False))
    assert len(channel.callbacks) == 1  # one wake for both
    channel.callbacks[0]()
    assert channel.published == [("x", "k", b"copy")]
    assert channel.acked == [1] and channel.rejected == [(2, False)]
    assert current.unsettled == set()


JOINED = Joining(lambda bodies: b"+".join(bodies), max_bytes=8, max_count=3)


def test_publications_settled_together_go_out_joined_within_their_bounds() -> None:
    """Joinable publications of one wake: one message for as many as the Joining's bounds hold,
    then an ack for each; others as they are. A join refused sends all its messages back."""
    channel = FakeChannel()
    current = connected(channel)
    settling = Settling("test", current)
    for tag, body in enumerate([b"a", b"b", b"c", b"d", b"eeeeeee", b"f"], start=1):
        settling.hand_back(item(current, tag), Outcome.forward(Publication("x", "k", body, joins=JOINED)))
    settling.hand_back(item(current, 7), Outcome.forward(Publication("x", "k", b"plain")))
    settling.hand_back(item(current, 8), Outcome.forward(Publication("y", "k", b"g", joins=JOINED)))
    settling.settle_waiting()
    assert channel.published == [
        ("x", "k", b"plain"),
        ("x", "k", b"a+b+c"),  # at most 3
        ("x", "k", b"d"),  # with the next it would pass 8 bytes
        ("x", "k", b"eeeeeee"),
        ("x", "k", b"f"),
        ("y", "k", b"g"),  # another exchange: its own
    ]
    assert sorted(channel.acked) == list(range(1, 9)) and current.unsettled == set()

    refusing = FakeChannel()
    refusing.basic_publish = _refuse  # type: ignore[method-assign]
    current = connected(refusing)
    settling = Settling("test", current)
    for tag in (1, 2):
        settling.hand_back(item(current, tag), Outcome.forward(Publication("x", "k", b"a", joins=JOINED)))
    settling.settle_waiting()
    assert refusing.acked == [] and refusing.rejected == [(1, True), (2, True)]


def _refuse(*_args: Any, **_kw: Any) -> None:
    raise pika.exceptions.NackError([])


def test_settling_drops_an_outcome_of_a_connection_since_lost() -> None:
    channel = FakeChannel()
    current = connected(channel)
    settling = Settling("test", current)
    stale = item(current, 7)
    current.forget()  # lost: the broker requeues tag 7 by itself
    settling.hand_back(stale, Outcome.done())
    assert channel.callbacks == []  # no connection to wake
    current.use(channel, channel, channel, channel.basic_ack)  # reconnected: a new generation
    settling.hand_back(stale, Outcome.done())
    settling.settle_waiting()
    assert channel.acked == []


NO_HOOKS = ConsumerHooks()


def handler_threads(
    handler: Callable[[Delivery], Outcome], hooks: ConsumerHooks = NO_HOOKS
) -> tuple[HandlerThreads, FakeChannel, CurrentConnection]:
    channel = FakeChannel()
    current = connected(channel)
    settling = Settling("parts", current)
    return HandlerThreads("parts", handler, 2, StopEvent(), hooks, current, settling), channel, current


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def acked_once_settled(threads: HandlerThreads, channel: FakeChannel, tags: list[int]) -> None:
    """Wait until settling the outcomes handed back has acked exactly `tags`."""

    def settled() -> bool:
        threads.settling.settle_waiting()
        return sorted(channel.acked) == tags

    wait_for(settled)


def stop(threads: HandlerThreads, current: CurrentConnection) -> None:
    threads.stop_event.set()
    current.forget()
    threads.wake()
    threads.join(5.0)


def test_handler_threads_hand_each_outcome_to_the_settling_and_hold_what_asks_to_wait() -> None:
    seen: list[Any] = []

    def handler(delivery: Delivery) -> Outcome:
        seen.append(delivery.memo)
        return (
            Outcome.hold(0.05, "again")
            if delivery.memo is None and delivery.body == b"hold"
            else Outcome.done()
        )

    threads, channel, current = handler_threads(handler)
    threads.start()
    try:
        threads.local.put(item(current, 1))
        threads.local.put(item(current, 2, b"hold"))

        def settled_both() -> bool:
            threads.settling.settle_waiting()  # as the connection's thread would, when woken
            return len(channel.acked) == 2

        wait_for(settled_both)
        assert sorted(channel.acked) == [1, 2]
        assert sorted(seen, key=str) == sorted(
            [None, None, "again"], key=str
        )  # back from its hold with its memo
    finally:
        threads.stop_event.set()
        current.forget()
        threads.wake()
        threads.join(5.0)
    assert not any(t.name.startswith("parts-") for t in threading.enumerate())


def run_wakes(channel: FakeChannel) -> None:
    """Run the callbacks queued for the connection's thread, as its next pass inside pika would."""
    callbacks, channel.callbacks = channel.callbacks, []
    for callback in callbacks:
        callback()


def test_a_message_waiting_for_a_report_comes_back_to_the_handler_with_it_even_after_the_stop() -> None:
    # As a stored page waits for its row's commit: the handler's thread goes on, the message
    # stays unacked, and once the report is done (on another thread) the handler is called
    # again with the memo, on the connection's thread, and decides; a message back with its
    # report is decided after the stop came too, where one not yet started goes back to its queue.
    reports = {tag: concurrent.futures.Future[None]() for tag in (1, 2)}
    decided: list[tuple[bytes, Any, str]] = []
    handed: list[int] = []

    def handler(delivery: Delivery) -> Outcome:
        if delivery.memo is None:
            tag = int(delivery.body)
            handed.append(tag)
            return Outcome.back_when(reports[tag], ("row", tag))
        decided.append((delivery.body, delivery.memo, threading.current_thread().name))
        failed = reports[delivery.memo[1]].exception(timeout=0)
        return Outcome.done() if failed is None else Outcome.reject(requeue=True)

    threads, channel, current = handler_threads(handler)
    threads.start()
    try:
        threads.local.put(item(current, 1, b"1"))
        threads.local.put(item(current, 2, b"2"))
        wait_for(lambda: len(handed) == 2)
        run_wakes(channel)
        threads.settling.settle_waiting()
        assert channel.acked == [] and channel.rejected == []  # both unacked, no thread busy
        reports[1].set_result(None)
        threads.stop_event.set()  # the stop comes before the second report
        threads.local.put(item(current, 3, b"3"))  # not started: given back
        reports[2].set_exception(RuntimeError("the database went away"))

        def settled_all() -> bool:
            run_wakes(channel)  # as the connection's thread does when woken
            threads.settling.settle_waiting()
            return len(channel.acked) + len(channel.rejected) == 3

        wait_for(settled_all)
        assert channel.acked == [1] and sorted(channel.rejected) == [(2, True), (3, True)]
        here = threading.current_thread().name  # the test stands in for the connection's thread
        assert sorted(decided) == [(b"1", ("row", 1), here), (b"2", ("row", 2), here)]
    finally:
        threads.stop_event.set()
        current.forget()
        threads.wake()
        threads.join(5.0)


def test_messages_back_with_their_reports_together_are_decided_and_settled_in_one_wake() -> None:
    # A writer reports a whole batch of rows at once: the first message back wakes the
    # connection's thread, which decides them all in turn and settles them in the same wake;
    # one whose channel has gone meanwhile is not decided (the broker has requeued it).
    reports = {tag: concurrent.futures.Future[None]() for tag in (1, 2, 3, 4)}
    deciders: list[int] = []

    def handler(delivery: Delivery) -> Outcome:
        if delivery.memo is None:
            return Outcome.back_when(reports[int(delivery.body)], int(delivery.body))
        deciders.append(delivery.memo)
        return Outcome.forward(Publication("x", "k", delivery.body, joins=JOINED))

    threads, channel, current = handler_threads(handler)  # no handler thread started
    threads._work_on(item(current, 4, b"4"))  # handed in as a handler thread would
    current.use(channel, channel, channel, channel.basic_ack)  # a reconnect: tag 4's channel is gone
    for tag in (1, 2, 3):
        threads._work_on(item(current, tag, str(tag).encode()))
    for report in reports.values():  # as the writer resolves a committed batch's reports
        report.set_result(None)
    assert channel.callbacks == [threads.decide_returned]  # one wake for the four
    assert threads.local.qsize() == 0 and channel.acked == []
    run_wakes(channel)
    assert deciders == [1, 2, 3]  # in the order they came back
    # Settled in that wake, their publications joined, and no other wake asked for.
    assert channel.published == [("x", "k", b"1+2+3")] and channel.acked == [1, 2, 3]
    assert channel.callbacks == [] and current.unsettled == set()


class BrokenReport(concurrent.futures.Future[None]):
    """A report that cannot be waited on: a bug past the handler, as the loop meets it."""

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[None]], object]) -> None:
        raise RuntimeError("a bug past the handler")


def test_a_lost_wake_or_a_bug_deciding_one_message_back_strands_none_of_the_others() -> None:
    # The wake for the messages back is lost (the connection closing as the writer reports),
    # and handing on one of them meets a bug: the loop's next pass on the connection's thread
    # decides the others all the same, and the one it failed on stays unacked.
    reports = {tag: concurrent.futures.Future[None]() for tag in (1, 2, 3)}

    def handler(delivery: Delivery) -> Outcome:
        if delivery.memo is None:
            return Outcome.back_when(reports[int(delivery.body)], int(delivery.body))
        return Outcome.back_when(BrokenReport(), "again") if delivery.memo == 2 else Outcome.done()

    threads, channel, current = handler_threads(handler)

    def closing(_callback: Callable[[], None]) -> None:
        raise pika.exceptions.ConnectionWrongStateError("the connection is closing")

    channel.add_callback_threadsafe = closing  # type: ignore[method-assign,assignment]
    for tag in (1, 2, 3):
        threads._work_on(item(current, tag, str(tag).encode()))
    for report in reports.values():
        report.set_result(None)  # no wake reached the connection's thread
    assert channel.acked == [] and current.unsettled == {1, 2, 3}
    threads.decide_returned()  # the loop's next pass
    assert channel.acked == [1, 3] and current.unsettled == {2}


def test_the_handler_is_called_again_after_a_pause_while_a_service_is_away() -> None:
    calls: list[float] = []
    pauses: list[float] = []

    def handler(_delivery: Delivery) -> Outcome:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ServiceUnavailable("Redis", "redis://", "connection refused")
        return Outcome.done()

    def pause(timeout: float | None = None) -> bool:  # the stop flag's wait, as the pauses take it
        assert timeout is not None
        pauses.append(timeout)
        return False

    threads, _channel, _current = handler_threads(handler)
    threads.stop_event.wait = pause  # type: ignore[method-assign]
    assert threads.handle(Delivery("q", b"{}", {}, False)) == Outcome.done()
    assert len(calls) == 3 and pauses == [1.0, 2.0]  # the retry policy's pauses, from the first failure
    threads.stop_event.set()  # a stop during an outage: the message goes back to its queue
    calls.clear()
    assert threads.handle(Delivery("q", b"{}", {}, False)) == Outcome.reject(requeue=True)
    assert len(calls) == 1


def test_handler_threads_reject_what_the_handler_fails_on_and_call_the_idle_hooks() -> None:
    idle: list[str] = []

    def broken(_delivery: Delivery) -> Outcome:
        raise KeyError("nobody foresaw this")

    hooks = ConsumerHooks(when_idle=lambda: idle.append("idle"), when_quiet=lambda: idle.append("quiet"))
    threads, _channel, _current = handler_threads(broken, hooks)
    assert threads.handle(Delivery("q", b"{}", {}, False)) == Outcome.reject(requeue=False)
    threads.call_if_quiet()  # nothing in hand, nothing waiting
    assert idle == ["quiet"]


def test_the_connection_thread_consumes_on_what_connect_opens_and_parks_what_park_holds() -> None:
    channel = FakeChannel()
    opened: list[tuple[str, int]] = []

    def connect(_settings: Settings, name: str, prefetch: int) -> tuple[Any, Any, Any]:
        opened.append((name, prefetch))
        return channel, channel, channel

    current = CurrentConnection()
    stop = StopEvent()
    settling = Settling("parts", current)
    threads = HandlerThreads("parts", lambda _d: Outcome.done(), 3, stop, ConsumerHooks(), current, settling)

    def park(delivery: Delivery) -> Outcome | None:
        return Outcome.hold(60.0) if delivery.body == b"later" else None

    link = ConnectionThread(
        Settings(), "parts", [Subscription("q")], threads, settling, current, stop, park, connect, False
    )
    deliveries = iter([b"now", b"later"])

    def pika_delivers() -> None:  # one message a poll; then both settled, and the stop
        body = next(deliveries, None)
        if body is None:
            if not stop.is_set():
                for tag in sorted(current.unsettled):
                    settling.hand_back(LocalItem(0, 0, tag, current.generation, tag, DONE), Outcome.done())
                stop.set()
            return
        tag = len(current.unsettled) + 1
        method = SimpleNamespace(delivery_tag=tag, redelivered=False)
        channel.consumers["q"](channel, method, SimpleNamespace(headers=None, priority=None), body)

    channel.events = pika_delivers
    link.consume()
    assert opened == [(f"parts {Settings().worker_id}", 6)]  # twice the handler threads
    assert [i.delivery.body for i in list(threads.local.queue)] == [b"now"]
    assert len(threads.held) == 1  # parked on the connection's thread, never handed to a handler
    assert sorted(channel.acked) == [1, 2]
    assert channel.is_open is False and current.connection is None  # drained and closed
