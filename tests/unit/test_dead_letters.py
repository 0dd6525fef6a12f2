"""From a dead-lettered message to the row the store keeps, and back to a replay message."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from dlq_consumer.record import DeadLetterRecord, bounded_record, json_safe, record_from_delivery
from dlq_consumer.replay import replay_publication
from dlq_consumer.service import DeadLetterRecorder
from shared.consumer import Delivery, Outcome
from shared.errors import ServiceUnavailable
from shared.messages import ATTEMPT_HEADER, REPLAY_HEADER, CrawlTask, Failure, Progress
from shared.settings import Settings
from tests.fakes import FakeConnector, FakeDeadLetterConnection

NS = "crawl"
TASK = CrawlTask(url="https://example.com/a", run_id="run1", queue="ttl", enqueued_at=1.0)


@dataclass(frozen=True)
class Message:
    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)


def expired_in(queue: str, count: int = 1) -> dict[str, Any]:
    """An x-death entry as pika decodes it: text as bytes or str, the time as a datetime."""
    return {
        "count": count,
        "reason": "expired",
        "queue": queue,
        "time": dt.datetime(2024, 5, 1, 12, 0, 0),
        "exchange": b"crawl.work",
        "routing-keys": [b"new.ttl"],
    }


def test_our_failure_headers_say_why_and_where() -> None:
    failure = Failure("http_500", "server error", 500, "crawl.ttl", "worker-7")
    headers = {**failure.to_headers(), **Progress(attempt=3, replays=1, first_failure_at=50.0).to_headers()}

    record = record_from_delivery(Message(TASK.encode(), headers), NS)

    assert (record.run_id, record.url) == ("run1", "https://example.com/a")
    assert (record.reason, record.last_error, record.http_status) == ("http_500", "server error", 500)
    assert (record.origin_queue, record.worker_id) == ("crawl.ttl", "worker-7")
    assert (record.attempts, record.replays, record.first_failed_at) == (
        3,
        1,
        dt.datetime(1970, 1, 1, 0, 0, 50, tzinfo=dt.UTC),
    )
    assert record.x_death is None
    assert record.body == TASK.encode()


def test_broker_expiry_is_read_from_the_newest_x_death_entry() -> None:
    headers = {"x-death": [expired_in("crawl.ttl"), expired_in("crawl.retry.5000ms", count=2)]}

    record = record_from_delivery(Message(TASK.encode(), headers), NS)

    assert record.reason == "expired"
    assert record.origin_queue == "crawl.ttl"
    assert "crawl.ttl" in record.last_error
    assert record.http_status is None
    assert record.x_death is not None and len(record.x_death) == 2
    assert record.x_death[0]["time"] == "2024-05-01T12:00:00"
    assert record.x_death[0]["exchange"] == "crawl.work"
    assert record.x_death[0]["routing-keys"] == ["new.ttl"]
    json.dumps(record.x_death)  # storable as jsonb


def test_a_queue_kind_from_the_worker_becomes_the_queue_name() -> None:
    headers = Failure("http_404", origin_queue="bulk").to_headers()

    assert record_from_delivery(Message(TASK.encode(), headers), NS).origin_queue == "crawl.bulk"


def test_our_reason_wins_over_an_old_x_death_from_a_delay_queue() -> None:
    headers = {
        **Failure("timeout", origin_queue="crawl.bulk").to_headers(),
        "x-death": [expired_in("crawl.retry.5000ms")],
    }

    record = record_from_delivery(Message(TASK.encode(), headers), NS)

    assert (record.reason, record.origin_queue) == ("timeout", "crawl.bulk")
    assert record.x_death is not None  # kept as history


def test_undecodable_body_is_keyed_by_its_hash() -> None:
    body = b"\xff not json"
    headers = {"x-death": [{"reason": "rejected", "queue": "crawl.bulk", "count": 1}]}

    record = record_from_delivery(Message(body, headers), NS)

    assert record.reason == "undecodable"
    assert record.url == "undecodable:" + hashlib.sha256(body).hexdigest()
    assert record.run_id == ""
    assert record.origin_queue == "crawl.bulk"
    assert "not JSON" in record.last_error


def test_undecodable_body_keeps_a_reason_the_worker_gave() -> None:
    headers = Failure("blocked_address", "private address").to_headers()

    record = record_from_delivery(Message(b"{}", headers), NS)

    assert record.reason == "blocked_address"
    assert record.url.startswith("undecodable:")


def test_replay_count_and_attempts_come_from_our_headers() -> None:
    headers = {ATTEMPT_HEADER: 2, REPLAY_HEADER: 4, "x-death": [expired_in("crawl.ttl")]}

    record = record_from_delivery(Message(TASK.encode(), headers), NS)

    assert (record.attempts, record.replays) == (2, 4)


def test_without_any_clue_the_reason_is_unknown_and_the_queue_comes_from_the_body() -> None:
    record = record_from_delivery(Message(TASK.encode()), NS)

    assert record.reason == "unknown"
    assert record.origin_queue == "crawl.ttl"
    assert (record.attempts, record.replays) == (0, 0)


def test_nul_characters_never_reach_postgresql() -> None:
    headers = Failure("http_500", "bad\x00byte", worker_id="w\x00").to_headers()
    task = CrawlTask(url="https://example.com/\x00", run_id="r", queue="bulk")

    record = record_from_delivery(Message(task.encode(), headers), NS)

    assert "\x00" not in record.last_error + record.worker_id + record.url
    assert "\x00" not in json.dumps(json_safe({"k\x00": [b"v\x00", float("nan")]}))


def test_a_real_delivery_is_accepted() -> None:
    delivery = Delivery("crawl.dead", TASK.encode(), {}, redelivered=True, priority=0)

    assert record_from_delivery(delivery, NS).url == TASK.url


def row(body: bytes, replays: int) -> DeadLetterRecord:
    now = dt.datetime.now(dt.UTC)
    return DeadLetterRecord(
        "run1",
        "u",
        "expired",
        "",
        None,
        3,
        replays,
        "crawl.ttl",
        "",
        body,
        None,
        now,
        id=7,
        last_failed_at=now,
    )


def test_replay_resets_attempts_and_counts_the_replay() -> None:
    task = CrawlTask(url="https://example.com/p", run_id="run1", queue="priority", priority=4)

    publication = replay_publication(row(task.encode(), replays=1), NS)

    assert publication is not None
    assert (publication.exchange, publication.routing_key) == ("crawl.work", "new.priority")
    assert publication.body == task.encode()
    assert Progress.from_headers(publication.headers) == Progress(attempt=0, replays=2)
    assert publication.priority == 4


def test_an_undecodable_row_cannot_be_replayed() -> None:
    assert replay_publication(row(b"garbage", replays=0), NS) is None


def test_recorder_acks_only_after_the_commit() -> None:
    connector = FakeConnector(FakeDeadLetterConnection())
    recorder = DeadLetterRecorder(Settings(crawl_namespace=NS), connect=connector)

    outcome = recorder(Delivery("crawl.dead", TASK.encode(), {}, redelivered=False))

    assert outcome == Outcome.done()
    (conn,) = connector.opened
    assert conn.commits == 1
    assert conn.executed[0]["url"] == TASK.url


def test_recorder_reports_a_lost_database_and_reconnects_next_time() -> None:
    broken, healthy = FakeDeadLetterConnection(fail_commit=True), FakeDeadLetterConnection()
    connector = FakeConnector(broken, healthy)
    recorder = DeadLetterRecorder(Settings(crawl_namespace=NS), connect=connector)
    delivery = Delivery("crawl.dead", TASK.encode(), {}, redelivered=False)

    with pytest.raises(ServiceUnavailable):
        recorder(delivery)
    assert broken.closed

    assert recorder(delivery) == Outcome.done()
    assert healthy.commits == 1


def test_a_bad_field_in_the_body_is_recorded_as_an_invalid_message() -> None:
    body = json.dumps({"url": "https://example.com/a", "run_id": "r" * 500, "queue": "bulk"}).encode()
    record = record_from_delivery(Message(body), NS)
    assert (record.reason, record.run_id, record.body) == ("invalid_message", "", body)
    assert record.url == f"undecodable:{hashlib.sha256(body).hexdigest()}"
    assert "'run_id'" in record.last_error


def test_a_long_body_is_kept_as_an_excerpt_whatever_its_headers_claim() -> None:
    body = b"x" * 100_000
    claims = {"crawl-body-bytes": 10**9, "crawl-body-sha256": "0" * 64}
    record = record_from_delivery(Message(body, claims), NS)
    assert (len(record.body), record.body_bytes, record.body_sha256) == (
        4096,
        100_000,
        hashlib.sha256(body).hexdigest(),
    )


def test_a_bounded_record_keeps_only_what_cannot_be_refused() -> None:
    record = record_from_delivery(
        Message(TASK.encode(), Failure("http_500", "é\ud800", 500).to_headers()), NS
    )
    bounded = bounded_record(record, "character with byte sequence \ud800 is not valid")
    assert (bounded.run_id, bounded.url) == ("", f"unstorable:{hashlib.sha256(TASK.encode()).hexdigest()}")
    assert (bounded.reason, bounded.http_status, bounded.body, bounded.x_death) == (
        "http_500",
        500,
        TASK.encode(),
        None,
    )
    assert bounded.last_error.isascii() and "PostgreSQL refused the row" in bounded.last_error
