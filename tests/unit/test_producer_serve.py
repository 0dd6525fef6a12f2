"""The producer service's handler: a request is acked only once its run is seeded to the end."""

from __future__ import annotations

import json
import threading
from typing import Any

from producer.serve import RequestSeeder
from producer.service import Options
from shared.consumer import Delivery, Outcome
from shared.crawl_request import CrawlRequest
from shared.settings import Settings

SEEDED = {"publish_failed": 0, "stopped_early": False, "left_claimed": 0, "sitemaps_failed": []}


class FakeProducer:
    """Seeds by recording what it was asked, answering with `result`; remembers seeded runs."""

    def __init__(self, result: dict[str, Any], seeded: dict[str, dict[str, Any]] | None = None) -> None:
        self.result = result
        self.seeded = dict(seeded or {})
        self.asked: list[Options] = []

    def seed(self, _settings: Settings, options: Options, _stop: threading.Event) -> dict[str, Any]:
        self.asked.append(options)
        return self.result

    def already_seeded(self, _settings: Settings, run_id: str) -> dict[str, Any] | None:
        return self.seeded.get(run_id)

    def mark(self, _settings: Settings, run_id: str, summary: dict[str, Any]) -> None:
        self.seeded[run_id] = summary


def handle(producer: FakeProducer, body: bytes, redelivered: bool = False) -> Outcome:
    seeder = RequestSeeder(
        Settings(), threading.Event(), producer.seed, producer.already_seeded, producer.mark
    )
    return seeder(Delivery("ns.control.runs", body, {}, redelivered))


REQUEST = CrawlRequest(
    run_id="r1",
    sitemaps=("https://example.com/sitemap.xml",),
    urls=("https://example.com/a",),
    sites=("https://example.com/",),
    recrawl_of="r0",
)


def test_a_request_is_seeded_as_the_producer_would_then_acked() -> None:
    producer = FakeProducer(SEEDED)
    assert handle(producer, REQUEST.encode()) == Outcome.done()
    assert producer.asked == [
        Options(
            run_id="r1",
            sitemaps=("https://example.com/sitemap.xml",),
            sites=("https://example.com/",),
            urls=("https://example.com/a",),
            recrawl_of="r0",
            once=True,
        )
    ]
    assert producer.seeded == {"r1": SEEDED}


def test_a_run_seeded_before_is_acked_without_reading_anything() -> None:
    producer = FakeProducer(SEEDED, seeded={"r1": {"seeded_at": "earlier"}})
    assert handle(producer, REQUEST.encode(), redelivered=True) == Outcome.done()
    assert producer.asked == []


def test_a_seeding_cut_short_gives_the_request_back() -> None:
    for cut in ({"stopped_early": True}, {"publish_failed": 3}, {"left_claimed": 2}):
        producer = FakeProducer({**SEEDED, **cut})
        assert handle(producer, REQUEST.encode()) == Outcome.reject(requeue=True)
        assert producer.seeded == {}, "a run not seeded to the end was marked seeded"


def test_failed_sitemaps_leave_the_run_unmarked_but_the_request_done() -> None:
    producer = FakeProducer({**SEEDED, "sitemaps_failed": [{"url": "u", "error": "404"}]})
    assert handle(producer, REQUEST.encode()) == Outcome.done()
    assert producer.seeded == {}


def test_requests_that_do_not_decode_or_name_blocked_addresses_are_parked_unseeded() -> None:
    blocked = CrawlRequest(run_id="r2", sitemaps=("http://169.254.169.254/latest/meta-data",))
    tampered = {**json.loads(REQUEST.encode()), "run_id": "../x"}
    for body in (b"not json", json.dumps(tampered).encode(), blocked.encode()):
        producer = FakeProducer(SEEDED)
        assert handle(producer, body) == Outcome.reject(requeue=False)
        assert producer.asked == []
