"""The worker's per-URL logic with injected fakes: no network, no broker, no database."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from shared.amqp.topology import build_topology
from shared.consumer import Delivery, Outcome
from shared.errors import BlockedAddress, PermanentError, ServiceUnavailable, TransientError, UnstorableRow
from shared.message_bounds import BODY_BYTES_HEADER, BODY_SHA256_HEADER
from shared.messages import (
    ATTEMPT_HEADER,
    ERROR_HEADER,
    REASON_HEADER,
    CrawlTask,
    Failure,
    Progress,
)
from shared.settings import Settings
from shared.try_later import HeldSlot, TryLater
from tests.fakes import FakeLimiter, FakeRunStates, FakeTime
from tests.sources import calls
from worker import handler
from worker.fetch.response import CacheEntry, Response
from worker.fetch.verdicts import Throttled
from worker.handler import CrawlHandler, Handling
from worker.handling import endings, waits
from worker.handling.endings import RowHandedIn
from worker.handling.storing import page_row
from worker.handling.waits import Parked, Waiting
from worker.parse.page import parse_page
from worker.parse.profiles import load_profiles
from worker.politeness import ratelimit_scripts
from worker.politeness.config import PolitenessConfig
from worker.politeness.domain_limiter import Reservation
from worker.politeness.gate import (
    RATE_HEADROOM,
    DomainGate,
)
from worker.politeness.robots import Robots, RobotsAnswer, RobotsRules
from worker.store.rows import PageRow, SkipRow

HTML = b"<html lang='en'><head><title>T</title></head><body><h1>H</h1><a href='/x'>x</a></body></html>"
SETTINGS = Settings(crawl_namespace="ns", retry_delays_s=(0.5, 1.0), max_attempts=3, rate_limit_rps=2.0)
ALLOW_ALL = RobotsAnswer(404, b"")
# MAX_HOLD_S=0: every wait beyond the inline one goes through the broker.
NO_HOLD = dataclasses.replace(SETTINGS, max_hold_s=0.0)


class FakeFetch:
    def __init__(
        self, outcomes: list[Response | Exception], robots: RobotsAnswer | Exception = ALLOW_ALL
    ) -> None:
        self.outcomes = outcomes
        self.robots = robots
        self.urls: list[str] = []
        self.revalidated: list[CacheEntry | None] = []
        self.robots_urls: list[str] = []

    def page(self, url: str, revalidate: CacheEntry | None) -> Response:
        self.urls.append(url)
        self.revalidated.append(revalidate)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def robots_txt(self, url: str) -> RobotsAnswer:
        self.robots_urls.append(url)
        if isinstance(self.robots, Exception):
            raise self.robots
        return self.robots


class FakeCache:
    def __init__(self, hit: CacheEntry | None = None) -> None:
        self.hit = hit
        self.puts: list[Response] = []
        self.reads = 0
        self.read_ahead_urls: list[str] = []
        self.dropped = 0

    def get(self, url: str) -> CacheEntry | None:
        self.reads += 1
        return self.hit

    def put(self, url: str, response: Response) -> bool:
        self.puts.append(response)
        return True

    def read_ahead(self, url: str) -> None:
        self.read_ahead_urls.append(url)

    def drop_read_ahead(self) -> None:
        self.dropped += 1


class FakeRobotsStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, domain: str) -> bytes | None:
        return self.values.get(domain)

    def put(self, domain: str, value: bytes, ttl_s: float) -> None:
        self.values[domain] = value

    def claim(self, domain: str, ttl_s: float) -> str | None:
        return "token"

    def unclaim(self, domain: str, token: str) -> None:
        pass


class FakeStore:
    def __init__(self) -> None:
        self.rows: list[PageRow] = []
        self.skips: list[SkipRow] = []
        self.hold = False  # keep commits pending until commit_held()
        self.held: list[Callable[[BaseException | None], None]] = []
        self.refusal: BaseException | None = None  # what every commit fails with, if anything

    def save_page_later(self, row: PageRow, committed: Callable[[BaseException | None], None]) -> None:
        self.rows.append(row)
        if self.hold:
            self.held.append(committed)
        else:
            committed(self.refusal)

    def save_skip(self, row: SkipRow) -> None:
        if self.refusal is not None:
            raise self.refusal
        self.skips.append(row)


@dataclasses.dataclass
class Rig:
    handler: CrawlHandler
    fetch: FakeFetch
    limiter: FakeLimiter
    store: FakeStore
    cache: FakeCache
    time: FakeTime


def ok_response(url: str = "http://a.test/p", from_cache: bool = False, **extra: Any) -> Response:
    return dataclasses.replace(
        Response(url, 200, "text/html", HTML, fetch_ms=None if from_cache else 12, from_cache=from_cache),
        **extra,
    )


def make(
    fetch: FakeFetch,
    cache: FakeCache | None = None,
    limiter: FakeLimiter | None = None,
    settings: Settings = SETTINGS,
) -> Rig:
    store = FakeStore()
    fake_time = FakeTime(100.0)
    limiter = limiter or FakeLimiter()
    cache = cache or FakeCache()
    gate = DomainGate(
        limiter, PolitenessConfig.from_settings(settings), settings, fake_time.sleep, fake_time.clock
    )
    robots = Robots(
        FakeRobotsStore(), settings.user_agent, 3600.0, 10.0, 2.0, fake_time.sleep, fake_time.clock
    )
    handler = CrawlHandler(
        settings=settings,
        topology=build_topology(settings),
        fetch=fetch,
        cache=cache,
        gate=gate,
        robots=robots,
        store=store,
        clock=lambda: 1000.0,
    )
    return Rig(handler, fetch, limiter, store, cache, fake_time)


def delivery(
    attempt: int = 0, body: bytes | None = None, queue: str = "bulk", url: str = "http://a.test/p"
) -> Delivery:
    task = CrawlTask(url=url, run_id="r1", queue=queue)
    headers = Progress(attempt=attempt).to_headers()
    return Delivery(f"ns.{queue}", body if body is not None else task.encode(), headers, False)


def settled(handle: Callable[[Delivery], Outcome], message: Delivery) -> Outcome:
    """The outcome `message` is settled with: for a stored page, decided when the message comes
    back with the writer's report on its row (the fake store reports at once)."""
    outcome = handle(message)
    if outcome.report is None:
        return outcome
    assert outcome.report.done() and isinstance(outcome.memo, RowHandedIn)
    return handle(dataclasses.replace(message, memo=outcome.memo))


def only_publication(outcome: Outcome) -> tuple[str, str, dict[str, object]]:
    assert outcome.ack is True
    assert len(outcome.publications) == 1
    pub = outcome.publications[0]
    return pub.exchange, pub.routing_key, dict(pub.headers)


def test_success_stores_one_row_and_acks() -> None:
    rig = make(FakeFetch([ok_response()]))
    outcome = settled(rig.handler, delivery())
    assert outcome == Outcome.done()
    assert len(rig.store.rows) == 1
    row = rig.store.rows[0]
    assert (row.url, row.run_id, row.title, row.h1, row.lang) == ("http://a.test/p", "r1", "T", "H", "en")
    assert row.links == ["http://a.test/x"]
    assert row.failed_attempts == 0 and row.from_cache is False
    assert (rig.store.rows[0].not_modified, rig.store.rows[0].proxy) == (False, None)


def test_transient_failure_goes_to_the_first_delay_queue_with_attempt_one() -> None:
    rig = make(FakeFetch([TransientError("http_500", "server error", 500)]))
    exchange, routing_key, headers = only_publication(rig.handler(delivery()))
    assert (exchange, routing_key) == ("ns.retry", "d500.bulk")
    assert headers[ATTEMPT_HEADER] == 1
    assert rig.store.rows == []


def test_third_transient_failure_is_dead_lettered_with_reason() -> None:
    rig = make(FakeFetch([TransientError("http_500", "server error", 500)]))
    exchange, _, headers = only_publication(rig.handler(delivery(attempt=2)))
    assert exchange == "ns.dlx"
    failure = Failure.from_headers(headers)
    assert failure is not None
    assert (failure.reason, failure.http_status, failure.origin_queue) == ("http_500", 500, "bulk")
    assert headers[ATTEMPT_HEADER] == 3


def test_permanent_failure_is_dead_lettered_at_once() -> None:
    rig = make(FakeFetch([PermanentError("http_404", "not found", 404)]))
    exchange, _, headers = only_publication(rig.handler(delivery()))
    assert exchange == "ns.dlx"
    assert headers[REASON_HEADER] == "http_404"
    assert headers[ATTEMPT_HEADER] == 1


@pytest.mark.parametrize(
    "headers",
    [{ATTEMPT_HEADER: 10**18}, {ATTEMPT_HEADER: -1000}, {ATTEMPT_HEADER: "1"}, {"crawl-replays": True}],
)
def test_a_header_out_of_bounds_is_an_invalid_message(headers: dict[str, object]) -> None:
    rig = make(FakeFetch([ok_response()]))
    message = dataclasses.replace(delivery(), headers=headers)
    exchange, _, published = only_publication(rig.handler(message))
    assert (exchange, published[REASON_HEADER], published[ATTEMPT_HEADER]) == ("ns.dlx", "invalid_message", 0)
    assert rig.fetch.urls == [] and rig.store.rows == []


def test_a_huge_body_is_dead_lettered_as_an_excerpt_with_its_size_and_hash() -> None:
    rig = make(FakeFetch([]))
    body = b'{"url": "' + b"x" * 50_000_000 + b'"}'
    outcome = rig.handler(delivery(body=body))
    exchange, _, headers = only_publication(outcome)
    assert (exchange, headers[REASON_HEADER]) == ("ns.dlx", "invalid_message")
    assert len(outcome.publications[0].body) == 4096
    assert headers[BODY_BYTES_HEADER] == len(body) and len(str(headers[BODY_SHA256_HEADER])) == 64


def test_a_row_the_database_refuses_is_dead_lettered_as_unstorable() -> None:
    rig = make(FakeFetch([ok_response()]))
    rig.store.refusal = UnstorableRow("index row size 1000080 exceeds btree version 4 maximum 2704")
    exchange, _, headers = only_publication(settled(rig.handler, delivery()))
    assert (exchange, headers[REASON_HEADER], headers[ATTEMPT_HEADER]) == ("ns.dlx", "unstorable", 0)
    assert "index row size" in str(headers[ERROR_HEADER])


def test_a_skip_the_database_refuses_is_dead_lettered_as_unstorable() -> None:
    rig = make(FakeFetch([], robots=RobotsAnswer(200, b"User-agent: *\nDisallow: /")))
    rig.store.refusal = UnstorableRow("value too long")
    exchange, _, headers = only_publication(rig.handler(delivery()))
    assert (exchange, headers[REASON_HEADER]) == ("ns.dlx", "unstorable")


def test_undecodable_body_is_dead_lettered_not_retried() -> None:
    rig = make(FakeFetch([]))
    exchange, _, headers = only_publication(rig.handler(delivery(body=b"\xff not json")))
    assert exchange == "ns.dlx"
    assert headers[REASON_HEADER] == "undecodable"
    assert rig.fetch.urls == [] and rig.fetch.robots_urls == []


def test_busy_domain_defers_through_the_broker_without_charging_an_attempt() -> None:
    limiter = FakeLimiter(
        Reservation(0.0, True), Reservation(4.0, False, "rate")
    )  # robots.txt, then the page
    rig = make(FakeFetch([]), limiter=limiter, settings=NO_HOLD)
    deferred, retried = deferrals("rate"), retries()
    exchange, routing_key, headers = only_publication(rig.handler(delivery(attempt=1)))
    # A defer queue, not a retry queue: nothing failed.
    assert (exchange, routing_key) == ("ns.defer", "d5000.bulk")
    assert headers[ATTEMPT_HEADER] == 1
    assert rig.fetch.urls == [] and rig.store.rows == [] and rig.time.slept == []
    assert (deferrals("rate") - deferred, retries() - retried) == (1, 0)


def test_a_url_whose_slot_is_beyond_the_inline_wait_is_held_with_its_slot_then_sent() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True, backoff=1.5))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    held = rig.handler(delivery())
    assert held.hold_s == 4.0 and held.ack is False and held.publications == ()
    assert isinstance(held.memo, Waiting) and isinstance(held.memo.slot, HeldSlot)
    assert held.memo.slot.domain == "a.test" and held.memo.slot.backoff == 1.5
    assert rig.fetch.urls == [] and rig.time.slept == []
    # Handed back when due: sent after one clear_held, no new reservation.
    rig.time.now = held.memo.slot.due
    reservations = len(limiter.rates)
    assert settled(rig.handler, dataclasses.replace(delivery(), memo=held.memo)) == Outcome.done()
    assert rig.fetch.urls == ["http://a.test/p"] and len(limiter.rates) == reservations
    assert limiter.released == ["held-lease"]


class FakeDeliveryLimit:
    """worker.handling.poison.DeliveryLimit's part the handler uses: records each call, and how many
    pages had been fetched by then."""

    def __init__(self, fetch: FakeFetch) -> None:
        self.fetch = fetch
        self.calls: list[tuple[str, str, int]] = []  # (call, url, pages fetched before it)

    def check(self, delivery: Delivery) -> Outcome | None:
        return None

    def mark_handling(self, delivery: Delivery) -> None:
        self._record("mark", delivery)

    def before_risk(self) -> None:
        self.calls.append(("before_risk", "", len(self.fetch.urls)))

    def unmark_handling(self, delivery: Delivery) -> None:
        self._record("unmark", delivery)

    def _record(self, call: str, delivery: Delivery) -> None:
        self.calls.append((call, CrawlTask.decode(delivery.body).url, len(self.fetch.urls)))


def test_a_url_held_behind_another_of_its_domain_leaves_no_handling_marker_and_its_send_does() -> None:
    # robots.txt, then p1 and p2 reserved 4 and 4.5 s ahead, beyond the inline wait (2 s).
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True), Reservation(4.5, True))
    rig = make(FakeFetch([ok_response(), ok_response("http://a.test/p2")]), limiter=limiter)
    limit = FakeDeliveryLimit(rig.fetch)
    handler = dataclasses.replace(rig.handler, delivery_limit=limit)
    first = handler(delivery())
    # The first URL of the domain cannot know it will wait: marked, and the mark taken away.
    assert limit.calls == [("mark", "http://a.test/p", 0), ("unmark", "http://a.test/p", 0)]
    second = handler(delivery(url="http://a.test/p2"))
    assert isinstance(second.memo, Waiting) and second.hold_s == 4.5
    assert limit.calls[2:] == []  # held behind the first: no marker, nothing to take away
    # Each send is marked, and the marker is in Redis before its fetch.
    for held, url in ((first, "http://a.test/p"), (second, "http://a.test/p2")):
        rig.time.now = held.memo.slot.due
        del limit.calls[:]
        fetched = len(rig.fetch.urls)
        assert settled(handler, dataclasses.replace(delivery(url=url), memo=held.memo)) == Outcome.done()
        assert limit.calls == [
            ("mark", url, fetched),
            ("before_risk", "", fetched),
            ("unmark", url, fetched + 1),
        ]
    assert rig.fetch.urls == ["http://a.test/p", "http://a.test/p2"]


@pytest.mark.parametrize("cached", [False, True])
def test_a_url_guessed_to_wait_is_still_marked_before_its_fetch_or_parse(cached: bool) -> None:
    """The guess is wrong when the slots moved back (a limiter that lost its state): the URL
    goes at once, and the marker with it, before the risk."""
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True), Reservation(0.0, True))
    hit = CacheEntry(ok_response("http://a.test/p2", from_cache=True), fresh=True)
    cache = FakeCache(hit if cached else None)
    rig = make(FakeFetch([ok_response("http://a.test/p2")]), cache=cache, limiter=limiter)
    limit = FakeDeliveryLimit(rig.fetch)
    handler = dataclasses.replace(rig.handler, delivery_limit=limit)
    cache.hit = None
    handler(delivery())  # held 4 s ahead
    cache.hit = hit if cached else None
    del limit.calls[:]
    assert settled(handler, delivery(url="http://a.test/p2")) == Outcome.done()
    assert limit.calls[:2] == [("mark", "http://a.test/p2", 0), ("before_risk", "", 0)]
    assert rig.fetch.urls == ([] if cached else ["http://a.test/p2"])
    assert len(rig.store.rows) == 1


@pytest.mark.parametrize(
    ("cached", "reads"),
    [
        (None, 1),  # nothing cached when it came: fetched after the hold without a second read
        (CacheEntry(ok_response(from_cache=True, etag='"v1"'), fresh=False), 2),  # read again to revalidate
    ],
)
def test_a_held_url_reads_the_cache_again_only_if_it_found_something_there(
    cached: CacheEntry | None, reads: int
) -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter, cache=FakeCache(cached))
    held = rig.handler(delivery())
    assert isinstance(held.memo, Waiting) and held.memo.slot is not None
    rig.time.now = held.memo.slot.due
    assert settled(rig.handler, dataclasses.replace(delivery(), memo=held.memo)) == Outcome.done()
    assert rig.fetch.urls == ["http://a.test/p"]
    assert rig.cache.reads == reads
    assert rig.fetch.revalidated == [cached]


def test_a_url_reads_its_cache_entry_ahead_when_it_first_comes_and_drops_it_after() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    held = rig.handler(delivery())
    assert rig.cache.read_ahead_urls == ["http://a.test/p"] and rig.cache.dropped == 1
    rig.time.now = held.memo.slot.due
    assert settled(rig.handler, dataclasses.replace(delivery(), memo=held.memo)) == Outcome.done()
    assert rig.cache.read_ahead_urls == ["http://a.test/p"]  # back from the hold: not again
    assert rig.cache.dropped == 2


def test_a_url_refused_within_the_hold_horizon_is_held_without_a_slot() -> None:
    horizon = SETTINGS.max_hold_s
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(horizon + 100.0, False, "rate"))
    rig = make(FakeFetch([]), limiter=limiter)
    held = rig.handler(delivery())
    # Back when its slot is within the hold horizon, to reserve it then.
    assert held.hold_s == pytest.approx(100.0)
    assert isinstance(held.memo, Waiting) and held.memo.slot is None
    assert held.publications == ()


def test_a_wait_beyond_the_hold_horizon_still_goes_through_a_defer_queue() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(3 * SETTINGS.max_hold_s, False, "paused"))
    rig = make(FakeFetch([]), limiter=limiter)
    exchange, routing_key, headers = only_publication(rig.handler(delivery(attempt=1)))
    assert (exchange, routing_key, headers[ATTEMPT_HEADER]) == ("ns.defer", "d30000.bulk", 1)


def test_a_url_held_for_twice_the_horizon_in_all_goes_through_a_defer_queue() -> None:
    horizon = SETTINGS.max_hold_s
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(horizon + 100.0, False, "rate"))
    rig = make(FakeFetch([]), limiter=limiter)
    # Held since 1.9 horizons ago: another 100 s would pass twice the horizon.
    long_held = Waiting(time.monotonic() - 1.9 * horizon)
    exchange, _, _ = only_publication(rig.handler(dataclasses.replace(delivery(), memo=long_held)))
    assert exchange == "ns.defer"


def deferrals(reason: str) -> float:
    return REGISTRY.get_sample_value("crawl_deferrals_total", {"reason": reason}) or 0.0


def retries() -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        if m.name == "crawl_retries"
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_short_rate_limit_wait_happens_in_process() -> None:
    rig = make(FakeFetch([ok_response()]), limiter=FakeLimiter(Reservation(0.3, True)))
    waits, waited_s = wait_metrics()
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert rig.time.slept == [0.3, 0.3]  # robots.txt, then the page
    assert len(rig.store.rows) == 1
    now_waits, now_waited_s = wait_metrics()
    assert now_waits - waits == 2
    assert now_waited_s - waited_s == pytest.approx(0.6)


def wait_metrics() -> tuple[float, float]:
    return (
        REGISTRY.get_sample_value("crawl_rate_limit_waits_total") or 0.0,
        REGISTRY.get_sample_value("crawl_rate_limit_wait_seconds_total") or 0.0,
    )


def test_fresh_cache_hit_skips_fetch_and_rate_limit() -> None:
    cached = CacheEntry(ok_response(from_cache=True), fresh=True)
    rig = make(FakeFetch([], robots=RobotsAnswer(404, b"")), cache=FakeCache(hit=cached))
    rig.handler.robots.rules_for("http://a.test/", rig.fetch.robots_txt)  # robots.txt known already
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert rig.fetch.urls == [] and rig.limiter.rates == []
    assert rig.store.rows[0].from_cache is True


def test_retry_keeps_the_ttl_queue_of_origin() -> None:
    rig = make(FakeFetch([TransientError("timeout", "read timed out")]))
    _, routing_key, _ = only_publication(rig.handler(delivery(queue="ttl")))
    assert routing_key == "d500.ttl"


def test_success_after_retries_records_failed_attempts() -> None:
    rig = make(FakeFetch([ok_response()]))
    rig.handler(delivery(attempt=2))
    assert dataclasses.asdict(rig.store.rows[0])["failed_attempts"] == 2


# robots.txt


def test_disallowed_url_is_skipped_with_reason_robots_and_never_fetched() -> None:
    robots = RobotsAnswer(200, b"User-agent: *\nDisallow: /p\n")
    rig = make(FakeFetch([ok_response()], robots=robots))
    assert settled(rig.handler, delivery()) == Outcome.done()  # acked, nothing to publish: no retry
    assert rig.fetch.urls == [] and rig.store.rows == []
    assert [(s.url, s.reason) for s in rig.store.skips] == [("http://a.test/p", "robots")]


def test_robots_txt_is_fetched_once_through_the_gate_for_many_urls() -> None:
    rig = make(FakeFetch([ok_response(), ok_response()]))
    rig.handler(delivery(url="http://a.test/p"))
    rig.handler(delivery(url="http://a.test/q"))
    assert rig.fetch.robots_urls == ["http://a.test/robots.txt"]
    assert len(rig.limiter.rates) == 3  # one robots.txt and two pages, each through the limiter
    assert len(rig.limiter.spaced_from_now) == 1  # the pages after robots.txt are spaced from its answer


def test_unreachable_robots_txt_fails_the_url_transiently_then_dead_letters_it() -> None:
    rig = make(FakeFetch([ok_response()], robots=RobotsAnswer(503, b"")))
    exchange, routing_key, headers = only_publication(rig.handler(delivery()))
    assert (exchange, routing_key, headers[ATTEMPT_HEADER]) == ("ns.retry", "d500.bulk", 1)
    exchange, _, headers = only_publication(rig.handler(delivery(attempt=2)))
    assert (exchange, headers[REASON_HEADER]) == ("ns.dlx", "robots_unavailable")
    assert rig.fetch.urls == [] and rig.store.rows == [] and rig.store.skips == []


def test_robots_txt_that_cannot_be_reached_is_unavailable_too() -> None:
    rig = make(FakeFetch([], robots=TransientError("connection_error", "refused")))
    _, _, headers = only_publication(rig.handler(delivery(attempt=2)))
    assert headers[REASON_HEADER] == "robots_unavailable"


def test_robots_switched_off_fetches_no_robots_txt() -> None:
    rig = make(
        FakeFetch([ok_response()], robots=RobotsAnswer(200, b"User-agent: *\nDisallow: /\n")),
        settings=dataclasses.replace(SETTINGS, respect_robots=False),
    )
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert rig.fetch.robots_urls == [] and len(rig.store.rows) == 1


def test_crawl_delay_lowers_the_rate_asked_for() -> None:
    rig = make(FakeFetch([ok_response()], robots=RobotsAnswer(200, b"User-agent: *\nCrawl-delay: 4\n")))
    rig.handler(delivery())
    robots_rate, page_rate = rig.limiter.rates
    assert robots_rate == pytest.approx(2.0 / RATE_HEADROOM)  # the configured rate
    assert page_rate == pytest.approx(0.25 / RATE_HEADROOM)  # 1 / Crawl-delay


# Throttling


def test_retry_after_pauses_the_domain_and_retries_the_url() -> None:
    rig = make(FakeFetch([Throttled("http_429", "Retry-After: 2", 429, 2.0)]))
    exchange, routing_key, headers = only_publication(rig.handler(delivery()))
    assert (exchange, routing_key, headers[ATTEMPT_HEADER]) == ("ns.retry", "d500.bulk", 1)
    assert rig.limiter.pauses == [2.0] and rig.limiter.slowed == []


def test_503_without_retry_after_slows_the_domain_down() -> None:
    rig = make(FakeFetch([Throttled("http_503", "", 503, None)]))
    only_publication(rig.handler(delivery()))
    assert len(rig.limiter.slowed) == 1 and rig.limiter.pauses == []


def test_a_pause_set_while_waiting_defers_instead_of_fetching() -> None:
    limiter = FakeLimiter(Reservation(0.5, True, lease="L"))
    rig = make(FakeFetch([ok_response()]), limiter=limiter, settings=NO_HOLD)
    rig.handler.robots.rules_for("http://a.test/", rig.fetch.robots_txt)  # robots.txt known already
    limiter.paused = 3.0  # another worker's 429, while this one sleeps towards its slot
    _, routing_key, headers = only_publication(rig.handler(delivery()))
    assert routing_key == "d5000.bulk" and headers[ATTEMPT_HEADER] == 0
    assert rig.fetch.urls == [] and limiter.released == ["L"]


def test_full_concurrency_waits_briefly_then_defers() -> None:
    busy = Reservation(0.0, False, "busy")
    rig = make(
        FakeFetch([ok_response()]), limiter=FakeLimiter(Reservation(0.0, True), busy), settings=NO_HOLD
    )
    _, routing_key, headers = only_publication(rig.handler(delivery()))
    assert routing_key == "d1000.bulk" and headers[ATTEMPT_HEADER] == 0
    assert sum(rig.time.slept) == pytest.approx(SETTINGS.max_inline_wait_s)
    assert rig.fetch.urls == []


def test_a_lease_is_released_after_the_fetch() -> None:
    limiter = FakeLimiter(Reservation(0.0, True, lease="R"), Reservation(0.0, True, lease="P", backoff=2.0))
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert limiter.released == ["R", "P"]


def test_benched_proxies_defer_without_charging_an_attempt() -> None:
    rig = make(FakeFetch([TryLater(7.0, "proxies_benched")]), settings=NO_HOLD)
    _, routing_key, headers = only_publication(rig.handler(delivery(attempt=1)))
    assert routing_key == "d30000.bulk" and headers[ATTEMPT_HEADER] == 1


# Cache revalidation


def test_stale_entry_is_revalidated_and_a_304_reuses_the_cached_body() -> None:
    stale = CacheEntry(ok_response(from_cache=True, etag='"v1"'), fresh=False)
    not_modified = Response(
        "http://a.test/p", 304, "", b"", fetch_ms=5, not_modified=True, proxy="http://127.0.0.1:9"
    )
    rig = make(FakeFetch([not_modified]), cache=FakeCache(hit=stale))
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert rig.fetch.revalidated == [stale]
    row = rig.store.rows[0]
    assert (row.title, row.http_status, row.from_cache, row.fetch_ms) == ("T", 200, True, 5)
    assert (rig.store.rows[0].not_modified, rig.store.rows[0].proxy) == (True, "http://127.0.0.1:9")
    assert [(r.status, r.body, r.etag) for r in rig.cache.puts] == [(200, HTML, '"v1"')]  # fresh again


def test_changed_page_replaces_the_cache_entry() -> None:
    stale = CacheEntry(ok_response(from_cache=True, etag='"v1"'), fresh=False)
    changed = ok_response(etag='"v2"', body=HTML.replace(b"<h1>H</h1>", b"<h1>New</h1>"))
    rig = make(FakeFetch([changed]), cache=FakeCache(hit=stale))
    rig.handler(delivery())
    assert rig.store.rows[0].h1 == "New" and rig.store.rows[0].not_modified is False
    assert [r.etag for r in rig.cache.puts] == ['"v2"']


def test_a_304_without_a_cache_entry_is_a_permanent_error() -> None:
    rig = make(FakeFetch([Response("http://a.test/p", 304, "", b"", fetch_ms=5, not_modified=True)]))
    _, _, headers = only_publication(rig.handler(delivery()))
    assert headers[REASON_HEADER] == "http_304"


def test_a_blocked_address_is_a_skip_with_its_reason_not_a_failure() -> None:
    rig = make(FakeFetch([BlockedAddress("http://a.test/p resolves to 10.0.0.7 (private)")]))
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert [(s.url, s.reason) for s in rig.store.skips] == [("http://a.test/p", "blocked_address")]
    assert "10.0.0.7" in rig.store.skips[0].detail
    assert rig.store.rows == []


def test_an_extraction_profile_fills_extracted_and_others_pay_nothing(tmp_path: Path) -> None:
    profile_file = tmp_path / "profiles.toml"
    profile_file.write_text(
        '[[profile]]\nname = "news"\nurl_pattern = "/news/"\n[profile.fields]\nh = "h1"\n'
    )
    rig = make(FakeFetch([ok_response("http://a.test/news/1"), ok_response()]))
    rig.handler.profiles = load_profiles(str(profile_file))
    rig.handler(delivery(url="http://a.test/news/1"))
    rig.handler(delivery())
    news, other = rig.store.rows
    assert (news.profile, news.extracted) == ("news", {"h": "H"})
    assert (other.profile, other.extracted) == (None, {})


def test_the_content_hash_depends_on_the_visible_text_only() -> None:
    same_text = HTML.replace(b"<title>T</title>", b"<title>T</title><script>var x = 1;</script>")
    rig = make(FakeFetch([ok_response(), ok_response(body=same_text), ok_response(body=b"<p>other</p>")]))
    for _ in range(3):
        rig.handler(delivery())
    first, second, third = (row.content_hash for row in rig.store.rows)
    assert first == second != third


def test_a_page_is_acked_only_once_its_row_is_committed() -> None:
    rig = make(FakeFetch([ok_response(), ok_response()]))
    rig.store.hold = True
    message = delivery()
    outcome = rig.handler(message)
    # The thread is free, the message not: unacked, to come back once the writer reports.
    assert outcome.ack is False and outcome.publications == ()
    assert outcome.report is not None and not outcome.report.done()
    assert len(rig.store.rows) == 1
    rig.store.held.pop()(None)  # the writer's report: committed
    assert outcome.report.done()
    assert rig.handler(dataclasses.replace(message, memo=outcome.memo)) == Outcome.done()

    failed = rig.handler(message)
    rig.store.held.pop()(ServiceUnavailable("PostgreSQL", "db", "down"))
    assert rig.handler(dataclasses.replace(message, memo=failed.memo)) == Outcome.reject(requeue=True)


# ---- The one decision point: CrawlHandler.decide, for each ending of a URL's story ----------
# Each step of the story ends in a value of worker/handling/endings.py, and `decide` alone turns
# it into the message's outcome; a stored page's twice: handed in (unacked, back once the writer
# reports), then settled from the writer's report.

TASK = CrawlTask(url="http://a.test/p", run_id="r1", queue="bulk")


def stored_page() -> endings.Stored:
    page = parse_page(HTML.decode(), TASK.url)
    row = page_row(TASK, ok_response(), page, Progress(), None, {}, "w")
    return endings.Stored(TASK, Progress(), ok_response(), row)


def test_decide_hands_a_stored_page_s_row_in_and_acks_it_once_the_writer_reports_it_committed() -> None:
    rig = make(FakeFetch([]))
    rig.store.hold = True
    stored = stored_page()
    handed_in = rig.handler.decide(Handling(delivery()), stored)
    assert handed_in.ack is False and handed_in.publications == ()  # unacked while the row is out
    assert handed_in.report is not None and not handed_in.report.done()
    assert handed_in.memo == endings.RowHandedIn(stored, handed_in.report)
    assert [row.url for row in rig.store.rows] == [TASK.url]
    rig.store.held.pop()(None)  # the writer reports: committed, nothing more
    written = handed_in.memo.written()
    assert written == endings.Written(stored, None)
    assert rig.handler.decide(Handling(delivery()), written) == Outcome.done()


def test_decide_dead_letters_a_failure_with_no_attempt_left_or_a_permanent_one() -> None:
    rig = make(FakeFetch([]))
    for error, attempt in (
        (TransientError("timeout", "slow"), 3),
        (PermanentError("http_404", "gone", 404), 1),
    ):
        failed = endings.Failed(TASK, Progress(attempt=attempt), error, "bulk")
        exchange, routing_key, headers = only_publication(rig.handler.decide(Handling(delivery()), failed))
        assert (exchange, routing_key) == ("ns.dlx", "bulk")
        assert (headers[REASON_HEADER], headers[ATTEMPT_HEADER]) == (error.reason, attempt)


def test_decide_dead_letters_a_page_whose_row_the_database_refuses() -> None:
    rig = make(FakeFetch([]))
    refused = endings.Written(stored_page(), UnstorableRow("value too long"))
    exchange, _, headers = only_publication(rig.handler.decide(Handling(delivery()), refused))
    assert (exchange, headers[REASON_HEADER], headers[ATTEMPT_HEADER]) == ("ns.dlx", "unstorable", 0)


def test_decide_writes_a_skip_s_row_and_acks_it() -> None:
    rig = make(FakeFetch([]))
    skipped = endings.Skipped(TASK, Progress(), "robots", "disallowed by robots.txt")
    assert rig.handler.decide(Handling(delivery()), skipped) == Outcome.done()
    assert [(s.url, s.reason, s.detail) for s in rig.store.skips] == [
        (TASK.url, "robots", "disallowed by robots.txt")
    ]


def test_decide_retries_a_transient_failure_later_while_it_has_attempts_left() -> None:
    rig = make(FakeFetch([]))
    failed = endings.Failed(TASK, Progress(attempt=1), TransientError("timeout", "slow"), "bulk")
    exchange, routing_key, headers = only_publication(rig.handler.decide(Handling(delivery()), failed))
    assert (exchange, routing_key, headers[ATTEMPT_HEADER]) == (
        "ns.retry",
        "d500.bulk",
        1,
    )  # the first delay, 0.5 s
    assert rig.store.rows == [] and rig.store.skips == []


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (ServiceUnavailable("PostgreSQL", "db", "down"), Outcome.reject(requeue=True)),  # back to its queue
        (RuntimeError("a bug in the writer"), Outcome.reject(requeue=False)),  # to the dead letters
    ],
)
def test_decide_returns_or_rejects_a_page_whose_write_failed(error: BaseException, outcome: Outcome) -> None:
    rig = make(FakeFetch([]))
    assert rig.handler.decide(Handling(delivery()), endings.Written(stored_page(), error)) == outcome


def test_every_outcome_of_the_handler_comes_from_decide() -> None:
    # No return in worker/handler.py's story builds an outcome of its own but `decide`'s (and
    # the copies and holds it passes through): the steps return endings.
    source = inspect.getsource(handler.CrawlHandler)
    story = [m for m in ast.walk(ast.parse(textwrap.dedent(source))) if isinstance(m, ast.FunctionDef)]
    for method in story:
        if method.name in ("decide", "parked"):
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Return) and node.value is not None:
                built = node.value
                text = ast.unparse(built)
                assert not text.startswith(("dead_letter(", "retry(", "Outcome.")), (method.name, text)


def test_a_paused_run_s_message_goes_once_to_its_hold_queue_unfetched() -> None:
    rig = make(FakeFetch([]))
    rig.handler.run_states = FakeRunStates(r1="paused")
    exchange, routing_key, headers = only_publication(rig.handler(delivery(attempt=1)))
    assert (exchange, routing_key) == ("ns.held", "r1")  # the run's hold queue is bound with its id
    assert headers[ATTEMPT_HEADER] == 1  # not charged an attempt
    assert rig.fetch.urls == [] and rig.store.rows == [] and rig.store.skips == []


def test_a_cancelled_run_s_message_is_skipped_with_reason_cancelled() -> None:
    rig = make(FakeFetch([]))
    rig.handler.run_states = FakeRunStates(r1="cancelled")
    assert rig.handler(delivery()) == Outcome.done()
    assert [(s.run_id, s.url, s.reason) for s in rig.store.skips] == [("r1", "http://a.test/p", "cancelled")]
    assert rig.fetch.urls == []


def test_a_running_run_s_message_is_fetched() -> None:
    rig = make(FakeFetch([ok_response()]))
    rig.handler.run_states = states = FakeRunStates(other="paused")
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert states.asked == ["r1"] and len(rig.store.rows) == 1


def test_the_run_s_state_is_read_ahead_on_arrival_and_after_a_hold_and_dropped_each_time() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    rig.handler.run_states = states = FakeRunStates()
    held = rig.handler(delivery())
    assert isinstance(held.memo, Waiting) and held.memo.slot is not None
    rig.time.now = held.memo.slot.due
    assert settled(rig.handler, dataclasses.replace(delivery(), memo=held.memo)) == Outcome.done()
    assert states.read_ahead_runs == ["r1", "r1"] and states.dropped == 2
    assert states.asked == ["r1", "r1"]


class FakeHandled:
    """Marks kept in a set; `broken` makes mark_later raise, as a closed Redis pool would."""

    def __init__(self, *urls: str, broken: bool = False) -> None:
        self.urls = set(urls)
        self.broken = broken
        self.checked: list[tuple[str, str, bool]] = []  # (url, kind, from_producer) of each check
        self.counted: list[bool] = []  # `counted` of each check: True for a URL back from a hold
        self.read_ahead_urls: list[str] = []
        self.when_checked: Callable[[], object] = lambda: None  # what check_moments records
        self.check_moments: list[object] = []

    def already_handled(self, task: CrawlTask, kind: str, from_producer: bool, counted: bool = False) -> bool:
        self.checked.append((task.url, kind, from_producer))
        self.counted.append(counted)
        self.check_moments.append(self.when_checked())
        return task.url in self.urls

    def read_ahead(self, task: CrawlTask) -> None:
        self.read_ahead_urls.append(task.url)

    def mark_later(self, task: CrawlTask) -> None:
        if self.broken:
            raise RuntimeError("the marks writer is gone")
        self.urls.add(task.url)

    def close(self) -> None:
        pass


def test_a_cancelled_run_s_copy_of_a_url_already_handled_is_not_skipped_again() -> None:
    rig = make(FakeFetch([]))
    rig.handler.run_states = FakeRunStates(r1="cancelled")
    rig.handler.handled = FakeHandled("http://a.test/p")
    assert rig.handler(delivery()) == Outcome.done()
    assert rig.store.skips == [] and rig.fetch.urls == []  # the URL keeps its one outcome

    assert rig.handler(delivery(url="http://a.test/other")) == Outcome.done()
    assert [s.url for s in rig.store.skips] == ["http://a.test/other"]


def test_each_delivery_is_checked_once_with_its_kind_and_a_settled_url_is_acked_unfetched() -> None:
    rig = make(FakeFetch([ok_response()]))
    rig.handler.handled = handled = FakeHandled("http://a.test/done")
    fresh = CrawlTask(url="http://a.test/done", run_id="r1", queue="bulk").encode()
    # As the producer publishes it (no headers), then the same message redelivered.
    assert rig.handler(Delivery("ns.bulk", fresh, {}, False)) == Outcome.done()
    assert rig.handler(Delivery("ns.bulk", fresh, {}, True)) == Outcome.done()
    # A copy a worker forwarded (a retry) of a URL not settled yet: fetched.
    assert settled(rig.handler, delivery(attempt=1)) == Outcome.done()
    assert handled.checked == [
        ("http://a.test/done", "copy", True),
        ("http://a.test/done", "redelivered", True),
        ("http://a.test/p", "forwarded", False),
    ]
    assert rig.fetch.urls == ["http://a.test/p"] and len(rig.store.rows) == 1


def test_a_paused_run_s_second_copy_of_a_settled_url_is_acked_not_held() -> None:
    rig = make(FakeFetch([]))
    rig.handler.run_states = FakeRunStates(r1="paused")
    rig.handler.handled = FakeHandled("http://a.test/p")
    assert rig.handler(delivery()) == Outcome.done()  # no hold-queue publication
    assert rig.store.skips == [] and rig.fetch.urls == []


def test_a_stored_page_is_acked_even_when_marking_it_handled_fails() -> None:
    rig = make(FakeFetch([ok_response()]))
    rig.handler.handled = FakeHandled(broken=True)
    assert settled(rig.handler, delivery()) == Outcome.done()
    assert len(rig.store.rows) == 1


def test_an_unstorable_skip_is_dead_lettered_with_the_message_s_real_progress() -> None:
    rig = make(FakeFetch([]))
    rig.handler.run_states = FakeRunStates(r1="cancelled")
    rig.store.refusal = UnstorableRow("value too long")
    exchange, _, headers = only_publication(rig.handler(delivery(attempt=2)))
    assert (exchange, headers[REASON_HEADER], headers[ATTEMPT_HEADER]) == ("ns.dlx", "unstorable", 2)


def test_a_held_message_with_no_hold_queue_bound_would_go_to_a_defer_queue() -> None:
    rig = make(FakeFetch([]))
    rig.handler.run_states = FakeRunStates(r1="paused")
    outcome = rig.handler(delivery(attempt=1))
    fallback = outcome.publications[0].if_unroutable
    assert fallback is not None
    assert (fallback.exchange, fallback.routing_key) == ("ns.defer", "d5000.bulk")
    assert Progress.from_headers(dict(fallback.headers)).attempt == 1


def test_every_skip_reason_given_is_listed_for_its_metric_series() -> None:
    """SKIP_REASONS starts each reason's series at 0 (worker/handler.py): a reason a Skipped
    ending is given anywhere in worker/ but missing from it would be born at its first skip,
    which increase() cannot see."""
    given = {  # Skipped(task, progress, reason, detail)
        call.args[2].value
        for call in calls("worker")
        if isinstance(call.func, ast.Name)
        and call.func.id == "Skipped"
        and len(call.args) > 2
        and isinstance(call.args[2], ast.Constant)
    }
    assert given
    assert given <= set(handler.SKIP_REASONS)


def test_a_url_back_from_a_hold_is_checked_again_but_not_counted_a_second_time() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    rig.handler.handled = handled = FakeHandled()
    arrived = Delivery(
        "ns.bulk", CrawlTask(url="http://a.test/p", run_id="r1", queue="bulk").encode(), {}, False
    )
    held = rig.handler(arrived)
    assert held.hold_s == 4.0 and isinstance(held.memo, Waiting) and held.memo.slot is not None
    rig.time.now = held.memo.slot.due
    assert settled(rig.handler, dataclasses.replace(arrived, memo=held.memo)) == Outcome.done()
    # One delivery, one count: the second check only asks whether another copy settled the URL.
    assert handled.checked == [("http://a.test/p", "copy", True)] * 2
    assert handled.counted == [False, True]
    assert rig.fetch.urls == ["http://a.test/p"]


def held_then_due(rig: Rig, handled: FakeHandled) -> Delivery:
    """The delivery of http://a.test/p back from its hold, its slot due (the limiter's second
    answer must hold it)."""
    rig.handler.handled = handled
    held = rig.handler(delivery())
    assert isinstance(held.memo, Waiting) and held.memo.slot is not None
    rig.time.now = held.memo.slot.due
    return dataclasses.replace(delivery(), memo=held.memo)


def test_a_url_back_with_its_slot_is_checked_in_its_send_s_clearance_round_trip() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    handled = FakeHandled()
    handled.when_checked = lambda: len(limiter.held_clears)  # clearances asked for by then
    back = held_then_due(rig, handled)
    assert settled(rig.handler, back) == Outcome.done()
    # Its mark was read ahead, to go with the clearance, and looked at only after it.
    assert handled.read_ahead_urls == ["http://a.test/p"]
    assert handled.counted == [False, True] and handled.check_moments == [0, 1]
    assert rig.fetch.urls == ["http://a.test/p"] and len(rig.store.rows) == 1


def test_a_url_settled_by_another_copy_while_held_is_acked_unfetched_and_its_lease_given_back() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    handled = FakeHandled()
    back = held_then_due(rig, handled)
    handled.urls.add("http://a.test/p")  # another copy stored meanwhile
    assert rig.handler(back) == Outcome.done()
    assert rig.fetch.urls == [] and rig.store.rows == [] and rig.store.skips == []
    assert limiter.held_clears == [8] and limiter.released == ["held-lease"]


def test_a_url_whose_run_was_cancelled_while_it_was_held_is_skipped_not_fetched() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    rig.handler.run_states = FakeRunStates()
    back = held_then_due(rig, FakeHandled())
    rig.handler.run_states = FakeRunStates(r1="cancelled")
    assert rig.handler(back) == Outcome.done()
    assert [(s.url, s.reason) for s in rig.store.skips] == [("http://a.test/p", "cancelled")]
    assert rig.fetch.urls == [] and limiter.released == ["held-lease"]


def test_a_url_whose_run_was_paused_while_it_was_held_goes_to_the_hold_queue_not_fetched() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    back = held_then_due(rig, FakeHandled())
    rig.handler.run_states = FakeRunStates(r1="paused")
    exchange, routing_key, _ = only_publication(rig.handler(back))
    assert (exchange, routing_key) == ("ns.held", "r1")
    assert rig.fetch.urls == [] and rig.store.skips == []


class BrokenRobots:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def rules_for(self, url: str, fetch: Callable[[str], RobotsAnswer]) -> RobotsRules:
        raise self.error


def test_a_url_settled_while_held_is_not_retried_when_its_send_fails_first() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))  # robots, page
    rig = make(FakeFetch([ok_response()]), limiter=limiter)
    handled = FakeHandled()
    back = held_then_due(rig, handled)
    handled.urls.add("http://a.test/p")
    rig.handler.robots = BrokenRobots(TransientError("robots_unavailable", "robots.txt answered 503"))
    assert rig.handler(back) == Outcome.done()  # no retry copy of a settled URL
    assert handled.counted == [False, True] and rig.fetch.urls == []


def test_every_wait_reason_raised_is_listed_for_its_metric_series() -> None:
    """WAIT_REASONS starts the hold and deferral series of each reason at 0 (worker/handler.py):
    a crawl whose waits are all held in-process must still show its deferral series to
    Prometheus. TryLater is raised in worker/ and in shared/ (the proxy pool); the reasons
    from the limiter's scripts are 'rate', 'busy', 'paused', 'spacing'."""
    given = {
        call.args[1].value
        for call in calls("worker", "shared")
        if isinstance(call.func, ast.Name)
        and call.func.id == "TryLater"
        and len(call.args) > 1
        and isinstance(call.args[1], ast.Constant)
    }
    from_scripts = {"rate", "busy", "paused", "spacing"}
    source = inspect.getsource(ratelimit_scripts)
    assert all(f"'{reason}'" in source for reason in from_scripts)
    assert given and given | from_scripts <= set(waits.WAIT_REASONS)


def test_a_url_whose_domain_waits_here_is_parked_until_that_slot_and_counted_when_handled() -> None:
    # robots.txt, then p1 reserved 4 s ahead; p2, handled after its parking, 4.5 s ahead.
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True), Reservation(4.5, True))
    rig = make(FakeFetch([]), limiter=limiter)
    rig.handler.handled = handled = FakeHandled()
    assert rig.handler.parked(delivery()) is None  # nothing of a.test held here yet
    assert rig.handler(delivery()).hold_s == 4.0
    before = time.monotonic()
    parked = rig.handler.parked(delivery(url="http://a.test/p2"))
    assert parked is not None and parked.hold_s is not None and isinstance(parked.memo, Parked)
    assert SETTINGS.max_inline_wait_s < parked.hold_s <= 4.0  # until the slot held for p1 comes
    assert before <= parked.memo.since <= time.monotonic()
    assert len(handled.checked) == 1 and len(limiter.calls) == 2  # parking asks nobody anything
    # Let go, it is handled as a URL just come: checked and counted, and held for its own slot,
    # its wait counted from when it was parked.
    held = rig.handler(dataclasses.replace(delivery(url="http://a.test/p2"), memo=parked.memo))
    assert held.hold_s == 4.5 and isinstance(held.memo, Waiting) and held.memo.slot is not None
    assert held.memo.since == parked.memo.since
    assert handled.counted == [False, False]
    assert rig.fetch.urls == []


@pytest.mark.parametrize(
    "arriving",
    [
        delivery(url="http://b.test/p"),  # another domain
        dataclasses.replace(delivery(url="http://a.test/p2"), memo=Parked(0.0)),  # let go already
        delivery(body=b"{not json"),  # the handler dead-letters these, as ever
        delivery(body=b'{"url": 7}'),
    ],
)
def test_only_a_new_task_of_a_domain_waiting_here_is_parked(arriving: Delivery) -> None:
    limiter = FakeLimiter(Reservation(0.0, True), Reservation(4.0, True))
    rig = make(FakeFetch([]), limiter=limiter)
    assert rig.handler(delivery()).hold_s == 4.0
    assert rig.handler.parked(arriving) is None


@pytest.mark.parametrize(
    ("settings", "slot_in_s", "parks"),
    [
        (SETTINGS, SETTINGS.max_inline_wait_s + 1.0, True),
        (SETTINGS, SETTINGS.max_inline_wait_s - 0.5, False),  # its own slot may come in line
        (NO_HOLD, 60.0, False),  # nothing is held with holding off
    ],
)
def test_a_url_is_parked_only_behind_a_slot_beyond_the_inline_wait(
    settings: Settings, slot_in_s: float, parks: bool
) -> None:
    rig = make(FakeFetch([]), settings=settings)
    rig.handler.holds._slots_held["a.test"] = time.monotonic() + slot_in_s  # as wait_here leaves it
    assert (rig.handler.parked(delivery(url="http://a.test/p2")) is not None) == parks
