"""The producer's pipeline when RabbitMQ or Redis goes away: unconfirmed batches are published
again once the service is back, an outage uses up none of the publish attempts, patience has a
bound, and a stop request settles what is in flight. Fakes stand in for the services, so every
timing is exact."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from producer.patience import MAX_RECONNECT_PAUSE_S, PUBLISH_ATTEMPTS, RECONNECT_PATIENCE_S
from producer.pipeline import Pipeline
from producer.routing import load_router
from producer.sitemaps import SitemapEntry
from shared.amqp.broker import Publication
from shared.errors import ServiceUnavailable
from shared.messages import CrawlTask
from tests.fakes import FakeTime, MemoryDedup

URLS = [f"http://example.com/{i}" for i in range(10)]


def down(service: str) -> ServiceUnavailable:
    return ServiceUnavailable(service, "127.0.0.1", "Connection refused")


@dataclass
class Confirms:
    outcomes: list[bool]

    def wait(self) -> list[bool]:
        return self.outcomes


@dataclass
class FlakyBroker:
    """Loses the confirms of the first `lost_batches` batches with its connection, then refuses
    connections `unreachable_calls` times, then confirms everything."""

    lost_batches: int = 0
    unreachable_calls: int = 0
    confirmed: list[str] = field(default_factory=list)

    def submit(self, publications: Sequence[Publication]) -> Confirms:
        if self.lost_batches:
            self.lost_batches -= 1
            return Confirms([False] * len(publications))
        if self.unreachable_calls:
            self.unreachable_calls -= 1
            raise down("RabbitMQ")
        self.confirmed += [CrawlTask.decode(p.body).url for p in publications]
        return Confirms([True] * len(publications))

    def publish_batch(self, publications: Sequence[Publication]) -> list[bool]:
        return self.submit(publications).wait()


def pipeline(
    broker: FlakyBroker,
    dedup: MemoryDedup,
    clock: FakeTime,
    should_stop: Callable[[], bool] = lambda: False,
    patience_s: float = RECONNECT_PATIENCE_S,
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
        should_stop=should_stop,
        patience_s=patience_s,
    )


def entries() -> list[SitemapEntry]:
    return [SitemapEntry(url, "seeds") for url in URLS]


def test_batches_lost_with_the_connection_are_published_again_once_the_broker_is_back() -> None:
    broker, dedup, clock = FlakyBroker(lost_batches=3, unreachable_calls=6), MemoryDedup(), FakeTime()
    counts = pipeline(broker, dedup, clock).run(entries())

    assert (counts.enqueued_total, counts.publish_failed) == (len(URLS), 0)
    assert sorted(broker.confirmed) == sorted(URLS)
    assert set(dedup.state.values()) == {"confirmed"}
    # A retry pause, then growing pauses while the broker is unreachable: none of them an attempt.
    assert clock.slept[:7] == [1.0, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert max(clock.slept) == MAX_RECONNECT_PAUSE_S


def test_an_unreachable_redis_is_waited_for_too() -> None:
    broker, dedup, clock = FlakyBroker(), MemoryDedup(unreachable_calls=3), FakeTime()
    counts = pipeline(broker, dedup, clock).run(entries())

    assert (counts.enqueued_total, counts.publish_failed) == (len(URLS), 0)
    assert clock.slept == [1.0, 2.0, 4.0]


def test_refusals_still_use_up_the_attempts_and_patience_has_a_bound() -> None:
    refused = FlakyBroker(lost_batches=PUBLISH_ATTEMPTS)  # the first batch, then every retry of it
    counts = pipeline(refused, MemoryDedup(), FakeTime()).run(entries()[:4])
    assert (counts.enqueued_total, counts.publish_failed) == (0, 4)

    gone = FlakyBroker(lost_batches=1, unreachable_calls=10**6)
    dedup, clock = MemoryDedup(), FakeTime()
    with pytest.raises(ServiceUnavailable):
        pipeline(gone, dedup, clock, patience_s=60.0).run(entries())
    assert clock.now <= 60.0 + 2 * MAX_RECONNECT_PAUSE_S
    assert dedup.state == {}  # every claim released: a re-run with the same run id publishes them


def test_a_stop_request_stops_reading_and_settles_what_is_in_flight() -> None:
    broker, dedup = FlakyBroker(), MemoryDedup()
    read = 0

    def source() -> Iterator[SitemapEntry]:
        nonlocal read
        for entry in entries():
            read += 1
            yield entry

    # The stop comes while the fifth URL is read: it is not taken, the four before it are settled.
    counts = pipeline(broker, dedup, FakeTime(), should_stop=lambda: read >= 5).run(source())
    assert counts.stopped_early
    assert counts.enqueued_total == len(broker.confirmed) == 4
    assert set(dedup.state.values()) == {"confirmed"}
