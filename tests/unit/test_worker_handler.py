"""The worker's per-URL logic with injected fakes: no network, no broker, no database."""

from __future__ import annotations

import dataclasses

import pytest

from shared.consumer import Delivery, Outcome
from shared.errors import PermanentError, TransientError
from shared.messages import ATTEMPT_HEADER, REASON_HEADER, CrawlTask, Failure, Progress
from shared.settings import Settings
from shared.topology import build_topology
from worker.handler import CrawlHandler, Response
from worker.store import PageRow

pytestmark = pytest.mark.unit

HTML = b"<html lang='en'><head><title>T</title></head><body><h1>H</h1><a href='/x'>x</a></body></html>"
SETTINGS = Settings(crawl_namespace="ns", retry_delays_s=(0.5, 1.0), max_attempts=3)


class FakeFetch:
    def __init__(self, outcomes: list[Response | Exception]) -> None:
        self.outcomes = outcomes
        self.urls: list[str] = []

    def __call__(self, url: str) -> Response:
        self.urls.append(url)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class FakeCache:
    def __init__(self, hit: Response | None = None) -> None:
        self.hit = hit

    def get(self, url: str) -> Response | None:
        return self.hit


class FakeRateLimit:
    def __init__(self, wait_s: float = 0.0, reserved: bool = True) -> None:
        self.answer = (wait_s, reserved)
        self.domains: list[str] = []

    def wait_s(self, domain: str) -> tuple[float, bool]:
        self.domains.append(domain)
        return self.answer


class FakeStore:
    def __init__(self) -> None:
        self.rows: list[PageRow] = []

    def save_page(self, row: PageRow) -> None:
        self.rows.append(row)


def ok_response(url: str = "http://a.test/p", from_cache: bool = False) -> Response:
    return Response(url, 200, "text/html", HTML, None if from_cache else 12, from_cache)


def make(
    fetch: FakeFetch,
    cache: FakeCache | None = None,
    rate: FakeRateLimit | None = None,
) -> tuple[CrawlHandler, FakeStore, list[float]]:
    store = FakeStore()
    slept: list[float] = []
    handler = CrawlHandler(
        settings=SETTINGS,
        topology=build_topology(SETTINGS),
        fetch_for_thread=lambda: fetch,
        cache=cache or FakeCache(),
        rate_limit=rate or FakeRateLimit(),
        store=store,
        sleep=slept.append,
        clock=lambda: 1000.0,
    )
    return handler, store, slept


def delivery(attempt: int = 0, body: bytes | None = None, queue: str = "bulk") -> Delivery:
    task = CrawlTask(url="http://a.test/p", run_id="r1", queue=queue)
    headers = Progress(attempt=attempt).to_headers()
    return Delivery(f"ns.{queue}", body if body is not None else task.encode(), headers, False)


def only_publication(outcome: Outcome) -> tuple[str, str, dict[str, object]]:
    assert outcome.ack is True
    assert len(outcome.publications) == 1
    pub = outcome.publications[0]
    return pub.exchange, pub.routing_key, dict(pub.headers)


def test_success_stores_one_row_and_acks() -> None:
    handler, store, _ = make(FakeFetch([ok_response()]))
    outcome = handler(delivery())
    assert outcome == Outcome.done()
    assert len(store.rows) == 1
    row = store.rows[0]
    assert (row.url, row.run_id, row.title, row.h1, row.lang) == ("http://a.test/p", "r1", "T", "H", "en")
    assert row.links == ["http://a.test/x"]
    assert row.failed_attempts == 0 and row.from_cache is False


def test_transient_failure_goes_to_the_first_delay_queue_with_attempt_one() -> None:
    fetch = FakeFetch([TransientError("http_500", "server error", 500)])
    handler, store, _ = make(fetch)
    exchange, routing_key, headers = only_publication(handler(delivery()))
    assert (exchange, routing_key) == ("ns.retry", "d500.bulk")
    assert headers[ATTEMPT_HEADER] == 1
    assert store.rows == []


def test_third_transient_failure_is_dead_lettered_with_reason() -> None:
    handler, _, _ = make(FakeFetch([TransientError("http_500", "server error", 500)]))
    exchange, _, headers = only_publication(handler(delivery(attempt=2)))
    assert exchange == "ns.dlx"
    failure = Failure.from_headers(headers)
    assert failure is not None
    assert (failure.reason, failure.http_status, failure.origin_queue) == ("http_500", 500, "bulk")
    assert headers[ATTEMPT_HEADER] == 3


def test_permanent_failure_is_dead_lettered_at_once() -> None:
    handler, _, _ = make(FakeFetch([PermanentError("http_404", "not found", 404)]))
    exchange, _, headers = only_publication(handler(delivery()))
    assert exchange == "ns.dlx"
    assert headers[REASON_HEADER] == "http_404"
    assert headers[ATTEMPT_HEADER] == 1


def test_undecodable_body_is_dead_lettered_not_retried() -> None:
    fetch = FakeFetch([])
    handler, _, _ = make(fetch)
    exchange, _, headers = only_publication(handler(delivery(body=b"\xff not json")))
    assert exchange == "ns.dlx"
    assert headers[REASON_HEADER] == "undecodable"
    assert fetch.urls == []


def test_busy_domain_defers_through_the_broker_without_charging_an_attempt() -> None:
    fetch = FakeFetch([])
    handler, store, slept = make(fetch, rate=FakeRateLimit(wait_s=4.0, reserved=False))
    exchange, routing_key, headers = only_publication(handler(delivery(attempt=1)))
    assert (exchange, routing_key) == ("ns.retry", "d5000.bulk")
    assert headers[ATTEMPT_HEADER] == 1
    assert fetch.urls == [] and store.rows == [] and slept == []


def test_short_rate_limit_wait_happens_in_process() -> None:
    fetch = FakeFetch([ok_response()])
    handler, store, slept = make(fetch, rate=FakeRateLimit(wait_s=0.3))
    assert handler(delivery()) == Outcome.done()
    assert slept == [0.3] and len(store.rows) == 1


def test_cache_hit_skips_fetch_and_rate_limit() -> None:
    fetch = FakeFetch([])
    rate = FakeRateLimit()
    handler, store, _ = make(fetch, cache=FakeCache(hit=ok_response(from_cache=True)), rate=rate)
    assert handler(delivery()) == Outcome.done()
    assert fetch.urls == [] and rate.domains == []
    assert store.rows[0].from_cache is True


def test_retry_keeps_the_ttl_queue_of_origin() -> None:
    handler, _, _ = make(FakeFetch([TransientError("timeout", "read timed out")]))
    _, routing_key, _ = only_publication(handler(delivery(queue="ttl")))
    assert routing_key == "d500.ttl"


def test_success_after_retries_records_failed_attempts() -> None:
    handler, store, _ = make(FakeFetch([ok_response()]))
    handler(delivery(attempt=2))
    assert dataclasses.asdict(store.rows[0])["failed_attempts"] == 2
