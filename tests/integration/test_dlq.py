"""The dead-letter service against the real broker and database."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord, record_from_delivery
from dlq_consumer.replay import replay
from dlq_consumer.service import DeadLetterRecorder
from shared.amqp import broker
from shared.amqp.topology import (
    build_topology,
    dead_letter_exchange,
    dead_letter_queue,
    new_task_routing_key,
    work_exchange,
    work_queue,
)
from shared.consumer import Delivery, StopEvent, Subscription, run_consumers
from shared.message_bounds import bounded_body
from shared.messages import CrawlTask, Failure, Progress
from shared.postgres import db
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_ttl(settings: Settings) -> Settings:
    """The same names, with a ttl queue whose messages expire almost at once."""
    return dataclasses.replace(settings, ttl_queue_expiry_s=0.3)


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    db.ensure_schema(settings)
    with db.connect(settings) as connection:
        yield connection


def task(url: str = "https://example.com/a", run_id: str = "run1", queue: str = "ttl") -> CrawlTask:
    return CrawlTask(url=url, run_id=run_id, queue=queue)


def publish(settings: Settings, publication: broker.Publication) -> None:
    connection = broker.connect(settings, "test-publisher")
    broker.declare_topology(connection, build_topology(settings))
    broker.publish(broker.confirm_channel(connection), publication)
    connection.close()


def get_one(settings: Settings, queue: str, timeout_s: float = 10) -> Delivery:
    """The next message of `queue`, acked, as the consumer runtime would hand it to a handler."""
    connection = broker.connect(settings, "test-getter")
    channel = connection.channel()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                return Delivery(
                    queue, body, properties.headers or {}, bool(method.redelivered), properties.priority or 0
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no message arrived in {queue}")
            time.sleep(0.05)
    finally:
        connection.close()


def wait_for(condition: Callable[[], bool], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def rows(conn: psycopg.Connection[Any], run_id: str | None = None) -> list[DeadLetterRecord]:
    found = store.select_rows(conn, store.Selection(run_id=run_id, state="all"))
    conn.commit()  # end the read transaction so later reads see new commits
    return found


def record(conn: psycopg.Connection[Any], settings: Settings, delivery: Delivery) -> None:
    store.upsert(conn, record_from_delivery(delivery, settings.crawl_namespace))
    conn.commit()


def failed(body: bytes, headers: dict[str, Any]) -> Delivery:
    return Delivery("dead", body, headers, redelivered=False)


def test_an_expired_task_is_recorded_with_its_queue(
    short_ttl: Settings, conn: psycopg.Connection[Any]
) -> None:
    ns = short_ttl.crawl_namespace
    publish(short_ttl, broker.Publication(work_exchange(ns), new_task_routing_key("ttl"), task().encode()))

    delivery = get_one(short_ttl, dead_letter_queue(ns))
    assert delivery.headers["x-death"][0]["reason"] == "expired"

    record(conn, short_ttl, delivery)
    record(conn, short_ttl, delivery)  # a redelivery rewrites the row

    (row,) = rows(conn)
    assert (row.run_id, row.url, row.reason) == ("run1", "https://example.com/a", "expired")
    assert row.origin_queue == work_queue(ns, "ttl")
    assert row.state == "dead"
    assert row.x_death is not None
    assert row.x_death[0]["reason"] == "expired"


def test_the_consumer_records_and_acks_what_reaches_the_dead_queue(
    short_ttl: Settings, conn: psycopg.Connection[Any]
) -> None:
    ns = short_ttl.crawl_namespace
    recorder = DeadLetterRecorder(short_ttl)
    stop = StopEvent()
    thread = threading.Thread(
        target=run_consumers,
        args=(short_ttl, "test-dlq", [Subscription(dead_letter_queue(ns))], recorder, 1),
        kwargs={"stop_event": stop},
        daemon=True,
    )
    thread.start()
    try:
        publish(
            short_ttl,
            broker.Publication(
                work_exchange(ns), new_task_routing_key("ttl"), task(url="https://example.com/late").encode()
            ),
        )
        publish(short_ttl, broker.Publication(dead_letter_exchange(ns), "", b"\x00garbage"))
        wait_for(lambda: len(rows(conn)) == 2)
    finally:
        stop.set()
        thread.join(timeout=30)
        recorder.close()

    reasons = {row.url: row.reason for row in rows(conn)}
    assert reasons["https://example.com/late"] == "expired"
    assert [r for u, r in reasons.items() if u.startswith("undecodable:")] == ["undecodable"]
    connection = broker.connect(short_ttl, "test-depth")
    assert broker.queue_depth(connection.channel(), dead_letter_queue(ns))[0] == 0  # all acked
    connection.close()


def test_an_undecodable_body_is_stored_for_inspection(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    record(conn, settings, failed(b"not a task", {}))

    (row,) = rows(conn)
    assert (row.reason, row.run_id, row.body) == ("undecodable", "", b"not a task")
    assert row.url.startswith("undecodable:")


def test_replay_sends_the_url_back_with_fresh_attempts_and_a_failure_brings_it_back(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ns = settings.crawl_namespace
    body = task(queue="bulk").encode()
    failure = Failure("http_500", "server error", 500, work_queue(ns, "bulk"), "w1").to_headers()
    record(conn, settings, failed(body, {**failure, **Progress(attempt=3).to_headers()}))

    connection = broker.connect(settings, "test-replay")
    broker.declare_topology(connection, build_topology(settings))
    channel = broker.confirm_channel(connection)
    result = replay(conn, lambda p: broker.publish(channel, p), store.Selection(run_id="run1"), ns)
    connection.close()

    assert (result.replayed, result.skipped) == (1, 0)
    again = get_one(settings, work_queue(ns, "bulk"))
    assert again.body == body
    assert Progress.from_headers(again.headers) == Progress(attempt=0, replays=1)
    (row,) = rows(conn)
    assert row.state == "replayed" and row.replayed_at is not None

    # The replayed URL fails three more times and is dead-lettered again.
    record(conn, settings, failed(body, {**failure, **Progress(attempt=3, replays=1).to_headers()}))

    (row,) = rows(conn)
    assert (row.state, row.replays, row.attempts) == ("dead", 1, 3)


def test_replay_skips_rows_it_cannot_route(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    record(conn, settings, failed(b"junk", {}))
    published: list[broker.Publication] = []

    result = replay(conn, published.append, store.Selection(), settings.crawl_namespace)

    assert (result.replayed, result.skipped, published) == (0, 1, [])
    assert rows(conn)[0].state == "dead"


def cli(settings: Settings, *args: str, database_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": settings.crawl_namespace,
        "REDIS_PREFIX": settings.redis_prefix,
        "PG_SCHEMA": settings.pg_schema,
        # the queues a process derives depend on these too
        "RETRY_DELAYS_S": ",".join(str(d) for d in settings.retry_delays_s),
        "TTL_QUEUE_EXPIRY_S": str(settings.ttl_queue_expiry_s),
        "DATABASE_URL": database_url or settings.database_url,
    }
    return subprocess.run(
        [sys.executable, "-m", "dlq_consumer", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_list_prints_the_rows_of_a_run_as_json(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    for n in range(3):
        record(
            conn,
            settings,
            failed(
                task(url=f"https://example.com/{n}").encode(),
                Failure("http_404", http_status=404).to_headers(),
            ),
        )
    record(conn, settings, failed(task(run_id="other").encode(), Failure("timeout").to_headers()))

    done = cli(settings, "list", "--run", "run1", "--json")

    assert done.returncode == 0, done.stderr
    listed = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["url"] for r in listed) == [f"https://example.com/{n}" for n in range(3)]
    assert {(r["run_id"], r["reason"], r["http_status"], r["state"]) for r in listed} == {
        ("run1", "http_404", 404, "dead")
    }


def test_purge_needs_yes_and_replay_dry_run_only_counts(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    for n in range(2):
        record(conn, settings, failed(task(url=f"https://example.com/{n}").encode(), {}))

    dry = cli(settings, "replay", "--dry-run")
    refused = cli(settings, "purge", "--run", "run1")
    assert (dry.returncode, dry.stdout.strip()) == (0, "would replay 2 dead letters")
    assert refused.returncode == 1 and "would delete 2" in refused.stdout
    assert len(rows(conn)) == 2

    purged = cli(settings, "purge", "--run", "run1", "--yes")
    assert purged.returncode == 0 and "deleted 2" in purged.stdout
    assert rows(conn) == []


def test_an_unreachable_database_is_one_line_and_exit_2(settings: Settings) -> None:
    done = cli(settings, "list", "--run", "X", "--json", database_url="postgresql://postgres@127.0.0.1:1/x")

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "PostgreSQL" in done.stderr and "Traceback" not in done.stderr


def test_a_50_mb_dead_letter_is_stored_as_an_excerpt_with_its_size_and_hash(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    body = b"\xff" * 50_000_000  # arrived without the worker cutting it (straight into the DLX)
    record(conn, settings, failed(body, {}))
    (row,) = rows(conn)
    stored = conn.execute("SELECT length(body), body_bytes, body_sha256 FROM dead_letters").fetchone()
    assert stored == (4096, 50_000_000, hashlib.sha256(body).hexdigest())
    assert row.url == f"undecodable:{hashlib.sha256(body).hexdigest()}"


def test_the_size_and_hash_of_a_body_the_worker_cut_are_kept(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    whole = b"{" + b" " * 100_000
    excerpt, about = bounded_body(whole)
    failure = Failure("invalid_message", "body of 100001 bytes", None, "bulk", "w1")
    record(conn, settings, failed(excerpt, {**failure.to_headers(), **about}))
    (row,) = rows(conn)
    stored = conn.execute("SELECT body_bytes, body_sha256 FROM dead_letters").fetchone()
    assert (row.reason, row.body, stored) == (
        "invalid_message",
        excerpt,
        (100_001, hashlib.sha256(whole).hexdigest()),
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"crawl-attempt": 10**18, "crawl-replays": -1000, "crawl-first-failure-at": 10**18},
        {"crawl-reason": "x" * 1_000_000, "crawl-error": "e" * 1_000_000, "crawl-http-status": 10**18},
        {"x-death": [{"reason": "expired", "queue": "q" * 1_000_000, "count": 10**30}] * 1000},
    ],
)
def test_headers_out_of_bounds_still_give_a_dead_letter_row(
    settings: Settings, conn: psycopg.Connection[Any], headers: dict[str, Any]
) -> None:
    """The issue's attempt 10**18 was 'integer out of range' here, and the message was parked."""
    recorder = DeadLetterRecorder(settings)
    assert recorder(failed(task().encode(), headers)).ack
    recorder.close()
    (row,) = rows(conn)
    assert row.url == "https://example.com/a" and row.attempts in (0,) and len(row.reason) <= 64


def test_a_dead_letter_postgresql_refuses_is_stored_in_bounded_form(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    """A lone surrogate cannot be sent to PostgreSQL: the row is stored with the outside fields
    dropped, keyed on the body's hash, instead of being retried for ever."""
    body = task().encode()
    failure = Failure("http_500", "bad \ud800 text", 500, "bulk", "w\ud800")
    recorder = DeadLetterRecorder(settings)
    assert recorder(failed(body, failure.to_headers())).ack
    recorder(failed(task(url="https://example.com/b").encode(), Failure("http_404").to_headers()))
    recorder.close()
    by_url = {row.url: row for row in rows(conn)}
    bounded = by_url.pop(f"unstorable:{hashlib.sha256(body).hexdigest()}")
    assert (bounded.reason, bounded.run_id, bounded.body, bounded.http_status) == ("http_500", "", body, 500)
    assert "PostgreSQL refused the row" in bounded.last_error
    assert list(by_url) == ["https://example.com/b"]  # the next dead letter stores as usual
