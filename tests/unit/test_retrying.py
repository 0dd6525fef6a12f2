"""The retry policy (shared/retrying.py) and the loops built on it: how many tries, which pauses,
which error at the end. A fake sleep (and clock) is injected, so every pause is exact and none
is waited out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from tenacity import Retrying
from tenacity.stop import StopBaseT

from producer.patience import MAX_RECONNECT_PAUSE_S, PUBLISH_ATTEMPTS, RETRY_PAUSE_S
from producer.pipeline import Pipeline
from producer.routing import load_router
from producer.sitemaps import SitemapEntry
from shared import retrying
from shared.amqp.broker import Publication
from shared.consumer import ConsumerRuntime, Delivery, Outcome, StopEvent
from shared.errors import ServiceUnavailable
from shared.settings import Settings
from tests.fakes import FakeTime, MemoryDedup
from tests.unit.test_store_isolation import FakeDatabase, write_batch


def down(attempt: int) -> ServiceUnavailable:
    return ServiceUnavailable("PostgreSQL", "127.0.0.1", f"refused on attempt {attempt}")


@dataclass
class Flaky:
    """Fails with ServiceUnavailable `failures` times, then answers "done"."""

    failures: int
    calls: int = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise down(self.calls)
        return "done"


def policy(stop: StopBaseT, clock: FakeTime, logged: list[float] | None = None) -> Retrying:
    pauses_logged = [] if logged is None else logged
    return retrying.patiently(
        ServiceUnavailable, stop, clock.sleep, lambda _error, pause_s: pauses_logged.append(pause_s)
    )


# ---- the policy ---------------------------------------------------------------------------------


def test_pauses_double_from_one_second_up_to_fifteen_and_the_last_error_is_raised_as_it_is() -> None:
    clock, call = FakeTime(), Flaky(failures=10**6)
    logged: list[float] = []
    with pytest.raises(ServiceUnavailable, match=r"refused on attempt 8$"):
        policy(retrying.stop_after_pausing(60.0), clock, logged)(call)
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]  # 60 s of pauses: no more
    assert logged == clock.slept  # each pause logged before it starts
    assert call.calls == 8


def test_a_call_that_comes_back_returns_its_answer() -> None:
    clock, call = FakeTime(), Flaky(failures=3)
    assert policy(retrying.stop_after_pausing(60.0), clock)(call) == "done"
    assert clock.slept == [1.0, 2.0, 4.0] and call.calls == 4


def test_errors_it_does_not_name_are_not_tried_again() -> None:
    clock, calls = FakeTime(), []

    def broken() -> None:
        calls.append(1)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        policy(retrying.stop_after_pausing(60.0), clock)(broken)
    assert calls == [1] and clock.slept == []


def test_a_deadline_stops_before_a_pause_that_would_end_past_it() -> None:
    clock, call = FakeTime(), Flaky(failures=10**6)
    with pytest.raises(ServiceUnavailable, match=r"attempt 4$"):
        policy(retrying.stop_before(10.0, clock.time), clock)(call)
    assert clock.slept == [1.0, 2.0, 4.0]  # at 7 s, a pause of 8 s would end at 15 s
    assert clock.now == 7.0


# ---- the result writer: a batch waits out up to 120 s of pauses -----------------------------------


def test_the_writer_keeps_its_batch_through_120_s_of_pauses_then_fails_its_rows() -> None:
    database = FakeDatabase(down_after=0)
    pauses: list[float] = []
    urls = ["http://a.test/1", "http://a.test/2"]
    outcomes = write_batch(database, urls, sleep=pauses.append)  # the default patience, 120 s
    assert pauses == [1.0, 2.0, 4.0, 8.0] + [15.0] * 7 and sum(pauses) == 120.0
    assert database.transactions == len(pauses) + 1  # a try before each pause, and one after the last
    assert all(isinstance(outcomes[url], ServiceUnavailable) for url in urls)
    assert database.committed == []


def test_the_writer_commits_the_batch_once_the_database_is_back() -> None:
    database, pauses = FakeDatabase(down_after=0), []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 4:
            database.down_after = None

    urls = ["http://a.test/1", "http://a.test/2"]
    outcomes = write_batch(database, urls, sleep=sleep)
    assert pauses == [1.0, 2.0, 4.0, 8.0] and outcomes == dict.fromkeys(urls)
    assert database.committed == urls


# ---- the consumer: paused handlers and reconnects, both cut short by the stop ------------------


class StopAfter(StopEvent):
    """A stop Event whose wait returns at once, recording the pause; set after `waits` of them."""

    def __init__(self, waits: int | None = None) -> None:
        super().__init__()
        self.waits = waits
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.pauses.append(timeout)
        if self.waits is not None and len(self.pauses) >= self.waits:
            self.set()
        return self.is_set()


class FakeLink:
    """A connection and its channel: lost on its first poll while the plan holds more connects,
    and otherwise the last one, which stops the run."""

    consumer_tags: tuple[str, ...] = ()
    is_open = True

    def __init__(self, runtime: ScriptedRuntime) -> None:
        self.runtime = runtime

    def process_data_events(self, time_limit: float) -> None:
        if self.runtime.plan:
            raise ConnectionError("connection reset")
        self.runtime.stop_event.set()

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        pass  # the stop's wake: the loop above looks at the flag next anyway

    def close(self) -> None:
        pass

    def basic_ack(self, _tag: int) -> None:
        pass


class ScriptedRuntime(ConsumerRuntime):
    """A runtime whose connects follow `plan` (True: connected, False: refused); no broker."""

    def __init__(self, stop: StopAfter, plan: list[bool]) -> None:
        self.plan = plan
        self.connects = 0
        super().__init__(
            Settings(), "test", [], lambda _d: Outcome.done(), 1, stop_event=stop, connect=self._open
        )

    def _open(self, _settings: Settings, _name: str, _prefetch: int) -> tuple[object, object, object]:
        self.connects += 1
        if not self.plan.pop(0):
            raise ServiceUnavailable("RabbitMQ", "127.0.0.1", "refused")
        link = FakeLink(self)
        return link, link, link


DELIVERY = Delivery("q", b"{}", {}, redelivered=False)


def runtime(stop: StopAfter, needs: Flaky) -> ConsumerRuntime:
    """A runtime whose handler calls `needs` (a service that may be away), then acks."""

    def handler(_delivery: Delivery) -> Outcome:
        needs()
        return Outcome.done()

    return ConsumerRuntime(Settings(), "test", [], handler, 1, stop_event=stop)


def test_a_handler_waits_out_an_outage_and_its_message_is_handled() -> None:
    stop, handler = StopAfter(), Flaky(failures=5)
    assert runtime(stop, handler).threads.handle(DELIVERY) == Outcome.done()
    assert stop.pauses == [1.0, 2.0, 4.0, 8.0, 15.0] and handler.calls == 6


def test_a_stop_during_an_outage_gives_the_message_back_after_one_more_try() -> None:
    stop, handler = StopAfter(waits=3), Flaky(failures=10**6)
    assert runtime(stop, handler).threads.handle(DELIVERY) == Outcome.reject(requeue=True)
    assert stop.pauses == [1.0, 2.0, 4.0] and handler.calls == 4


def test_a_handler_bug_is_dead_lettered_without_a_pause() -> None:
    stop = StopAfter()

    def broken(_delivery: Delivery) -> Outcome:
        raise KeyError("nobody foresaw this")

    consumer = ConsumerRuntime(Settings(), "test", [], broken, 1, stop_event=stop)
    assert consumer.threads.handle(DELIVERY) == Outcome.reject(requeue=False) and stop.pauses == []


def test_a_lost_connection_is_followed_by_growing_pauses_that_start_over_once_connected() -> None:
    stop = StopAfter()
    # Connected, lost; refused twice, connected, lost; refused once, connected: the run ends.
    consumer = ScriptedRuntime(stop, [True, False, False, True, False, True])
    assert consumer.run() == 0
    assert stop.pauses == [1.0, 2.0, 4.0, 1.0, 2.0]
    assert consumer.connects == 6 and consumer.reconnects == 2


def test_a_stop_during_a_pause_ends_the_run_without_another_connect() -> None:
    stop = StopAfter(waits=2)
    consumer = ScriptedRuntime(stop, [True] + [False] * 10)
    assert consumer.run() == 0
    assert stop.pauses == [1.0, 2.0] and consumer.connects == 2 and consumer.reconnects == 0


def test_a_first_connect_that_fails_ends_the_run_at_once() -> None:
    stop = StopAfter()
    consumer = ScriptedRuntime(stop, [False, True])
    with pytest.raises(ServiceUnavailable, match="refused"):
        consumer.run()
    assert stop.is_set() and stop.pauses == [] and consumer.connects == 1


# ---- the producer: publish retries, and patience with RabbitMQ and Redis ---------------------------


@dataclass
class Confirms:
    outcomes: list[bool]

    def wait(self) -> list[bool]:
        return self.outcomes


@dataclass
class RefusingBroker:
    """Refuses (nacks) the first `refusals` publishes of each URL; unreachable for the calls
    numbered in `unreachable`."""

    refusals: int = 0
    unreachable: set[int] = field(default_factory=set)
    tries: dict[bytes, int] = field(default_factory=dict)
    calls: int = 0

    def submit(self, publications: Sequence[Publication]) -> Confirms:
        self.calls += 1
        if self.calls in self.unreachable:
            raise ServiceUnavailable("RabbitMQ", "127.0.0.1", f"refused on call {self.calls}")
        for p in publications:
            self.tries[p.body] = self.tries.get(p.body, 0) + 1
        return Confirms([self.tries[p.body] > self.refusals for p in publications])

    def publish_batch(self, publications: Sequence[Publication]) -> list[bool]:
        return self.submit(publications).wait()


URLS = [SitemapEntry(f"http://example.com/{i}", "seeds") for i in range(4)]  # one batch


def pipeline(
    broker: RefusingBroker, dedup: MemoryDedup, clock: FakeTime, patience_s: float = 240.0
) -> Pipeline:
    return Pipeline(
        "r",
        "ns",
        4,
        load_router(""),
        dedup,
        broker,
        clock=clock.time,
        sleep=clock.sleep,
        patience_s=patience_s,
    )


# The pauses between publish attempts: doubling from RETRY_PAUSE_S up to MAX_RECONNECT_PAUSE_S.
PUBLISH_PAUSES = [min(RETRY_PAUSE_S * 2**n, MAX_RECONNECT_PAUSE_S) for n in range(PUBLISH_ATTEMPTS - 1)]


def test_refused_publishes_are_tried_again_a_growing_pause_apart_and_confirmed() -> None:
    broker, dedup, clock = RefusingBroker(refusals=PUBLISH_ATTEMPTS - 1), MemoryDedup(), FakeTime()
    counts = pipeline(broker, dedup, clock).run(URLS)
    assert (counts.enqueued_total, counts.publish_failed) == (4, 0)
    assert broker.calls == PUBLISH_ATTEMPTS and set(broker.tries.values()) == {PUBLISH_ATTEMPTS}
    assert clock.slept == PUBLISH_PAUSES == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]


def test_publishes_refused_every_time_are_given_up_after_the_last_attempt_and_released() -> None:
    broker, dedup, clock = RefusingBroker(refusals=10**6), MemoryDedup(), FakeTime()
    counts = pipeline(broker, dedup, clock).run(URLS)
    assert (counts.enqueued_total, counts.publish_failed) == (0, 4)
    assert broker.calls == PUBLISH_ATTEMPTS and clock.slept == PUBLISH_PAUSES
    assert dedup.state == {}  # released: a re-run publishes them


def test_an_unreachable_broker_during_a_retry_is_waited_for_without_using_up_an_attempt() -> None:
    broker = RefusingBroker(refusals=1, unreachable={2, 3, 4})  # the retry meets 3 refusals to connect
    dedup, clock = MemoryDedup(), FakeTime()
    counts = pipeline(broker, dedup, clock).run(URLS)
    assert (counts.enqueued_total, counts.publish_failed) == (4, 0)
    assert clock.slept == [RETRY_PAUSE_S, 1.0, 2.0, 4.0]


def test_patience_has_a_bound_on_the_injected_clock_and_then_the_retry_is_given_up() -> None:
    broker = RefusingBroker(refusals=1, unreachable=set(range(2, 10**6)))
    dedup, clock = MemoryDedup(), FakeTime()
    counts = pipeline(broker, dedup, clock, patience_s=60.0).run(URLS)
    assert (counts.enqueued_total, counts.publish_failed) == (0, 4)
    # The retry pause, then from 1 s: 1+2+4+8+15+15+15 = 60 s, all within the patience; one
    # more 15 s pause would end past it, so the retry gives up after its 8th call.
    assert clock.slept == [RETRY_PAUSE_S, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert broker.calls == 1 + 8 and dedup.state == {}


def test_an_unreachable_redis_is_waited_for_with_the_same_pauses() -> None:
    broker, dedup, clock = RefusingBroker(), MemoryDedup(unreachable_calls=3), FakeTime()
    counts = pipeline(broker, dedup, clock).run(URLS)
    assert (counts.enqueued_total, counts.publish_failed) == (4, 0)
    assert clock.slept == [1.0, 2.0, 4.0]
