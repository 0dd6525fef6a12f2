"""The status command against a seeded database, Redis and queues with messages in them."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlq_consumer import store
from dlq_consumer.record import record_from_delivery
from ops.copies import Copies
from ops.management import HttpGet
from ops.status import CLEAR_SCREEN, gather
from shared.amqp import broker
from shared.amqp.topology import build_topology, new_task_routing_key, work_exchange, work_queue
from shared.consumer import Delivery
from shared.messages import CrawlTask, Failure
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
RUN = "run-s"
CLOSED_PORT_HTTP = "http://127.0.0.1:1"


@pytest.fixture
def seeded(settings: Settings) -> Settings:
    """4 pages, 3 dead letters (2 expired, 1 http_404), 1 replayed, 3 skips and 2 counters for
    RUN; a page of another run; 3 tasks waiting in the bulk queue and 1 in the priority queue."""
    db.ensure_schema(settings)
    with db.connect(settings) as conn:
        for n in range(4):
            conn.execute(
                "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id)"
                " VALUES (%s, %s, %s, 200, 'bulk', 'w')",
                (RUN, f"https://example.com/p{n}", f"https://example.com/p{n}"),
            )
        conn.execute(
            "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id)"
            " VALUES ('older', 'https://example.com/', 'https://example.com/', 200, 'bulk', 'w')"
        )
        for url, reason in (("d1", "expired"), ("d2", "expired"), ("d3", "http_404"), ("d4", "http_500")):
            body = CrawlTask(url=f"https://example.com/{url}", run_id=RUN, queue="bulk").encode()
            delivery = Delivery("dead", body, Failure(reason).to_headers(), redelivered=False)
            store.upsert(conn, record_from_delivery(delivery, settings.crawl_namespace))
        conn.execute("UPDATE dead_letters SET state = 'replayed' WHERE reason = 'http_500'")
        for url, reason in (("s1", "robots"), ("s2", "robots"), ("s3", "blocked_address")):
            conn.execute(
                "INSERT INTO skips (run_id, url, reason) VALUES (%s, %s, %s)",
                (RUN, f"https://example.com/{url}", reason),
            )
    client = connect_redis(settings, OPERATOR)
    client.hset(Keys(settings.redis_prefix).run_stats(RUN), mapping={"enqueued.bulk": 10, "retries": 2})
    client.close()

    connection = broker.connect(settings, "test-seeder")
    broker.declare_topology(connection, build_topology(settings))
    channel = broker.confirm_channel(connection)
    ns = settings.crawl_namespace
    for kind, count in (("bulk", 3), ("priority", 1)):
        for n in range(count):
            body = CrawlTask(url=f"https://example.com/q{n}", run_id=RUN, queue=kind).encode()
            broker.publish(channel, broker.Publication(work_exchange(ns), new_task_routing_key(kind), body))
    connection.close()
    return settings


def status(settings: Settings, *args: str, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": settings.crawl_namespace,
        "REDIS_PREFIX": settings.redis_prefix,
        "PG_SCHEMA": settings.pg_schema,
        # the queues a process derives depend on these too
        "RETRY_DELAYS_S": ",".join(str(d) for d in settings.retry_delays_s),
        "TTL_QUEUE_EXPIRY_S": str(settings.ttl_queue_expiry_s),
        "DATABASE_URL": settings.database_url,
        "RABBITMQ_MANAGEMENT_URL": settings.rabbitmq_management_url,
        **env_overrides,
    }
    return subprocess.run(
        [sys.executable, "-m", "ops.status", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def depths(report: dict[str, Any]) -> dict[str, tuple[Any, Any, Any]]:
    return {q["name"]: (q["ready"], q["unacked"], q["consumers"]) for q in report["queues"]}


def assert_run_figures(report: dict[str, Any], settings: Settings) -> None:
    progress = dict(report["run"].pop("progress"))
    # Every outcome was committed moments ago: all ten count in the rate's window.
    assert progress.pop("pages_per_s") > 0
    assert progress.pop("line").startswith("stored 4 (")
    assert progress == {
        "run_id": RUN,
        "enqueued": 10,
        "stored": 4,
        "dead": 3,
        "skipped": 3,
        "left": 0,
        "eta_s": 0.0,
        "producing": False,
        "window_s": 30.0,
    }
    assert report["run"] == {
        "run_id": RUN,
        "redis_prefix": settings.redis_prefix,
        "pages": 4,
        "dead_letters": {"expired": 2, "http_404": 1},
        "replayed": 1,
        "skips": {"robots": 2, "blocked_address": 1},
        "counters": {"enqueued.bulk": 10, "retries": 2},
        "copies": Copies.from_counters({"enqueued.bulk": 10}).figures(),
    }
    assert report["run"]["copies"]["first"] == 10 and report["run"]["copies"]["delivered"] == 0


def test_json_report_matches_the_management_api_and_the_database(
    seeded: Settings, management_api: HttpGet
) -> None:
    ns = seeded.crawl_namespace
    bulk, priority = work_queue(ns, "bulk"), work_queue(ns, "priority")
    # The management API refreshes its figures every few seconds: wait until it has caught up.
    deadline = time.monotonic() + 30
    while depths(gather(seeded, None))[bulk] != (3, 0, 0):
        assert time.monotonic() < deadline, "the management API never showed the messages"
        time.sleep(0.5)

    done = status(seeded, "--run", RUN, "--json")

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["queue_source"] == "management"
    queues = depths(report)
    assert queues[bulk] == (3, 0, 0)
    assert queues[priority] == (1, 0, 0)
    assert {q["name"] for q in report["queues"]} == {q.name for q in build_topology(seeded).queues}
    assert all(q["exists"] for q in report["queues"])
    assert_run_figures(report, seeded)


def test_without_the_management_api_depths_come_from_the_broker(seeded: Settings) -> None:
    done = status(seeded, "--run", RUN, "--json", RABBITMQ_MANAGEMENT_URL=CLOSED_PORT_HTTP)

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["queue_source"] == "amqp"
    ns = seeded.crawl_namespace
    assert depths(report)[work_queue(ns, "bulk")] == (3, None, 0)
    assert depths(report)[work_queue(ns, "ttl")] == (0, None, 0)
    assert_run_figures(report, seeded)


def test_without_a_run_the_latest_runs_are_listed(seeded: Settings) -> None:
    report = gather(dataclasses.replace(seeded, rabbitmq_management_url=CLOSED_PORT_HTTP), None)

    runs = {r["run_id"]: r for r in report["runs"]}
    assert (runs[RUN]["pages"], runs[RUN]["dead_letters"], runs[RUN]["skips"]) == (4, 3, 3)
    assert (runs["older"]["pages"], runs["older"]["dead_letters"]) == (1, 0)


def test_the_table_names_queues_and_figures(seeded: Settings) -> None:
    done = status(seeded, "--run", RUN, RABBITMQ_MANAGEMENT_URL=CLOSED_PORT_HTTP)

    assert done.returncode == 0, done.stderr
    bulk = f"{seeded.crawl_namespace}.bulk"
    bulk_line = next(line for line in done.stdout.splitlines() if line.startswith(bulk))
    assert bulk_line.split() == [bulk, "work", "3", "?", "0"]
    assert "expired=2 http_404=1" in done.stdout


def test_missing_queues_are_reported_not_fatal(settings: Settings) -> None:
    fallback = dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP)
    for each in (settings, fallback):
        report = gather(each, RUN)
        assert not any(q["exists"] for q in report["queues"])
        assert report["run"]["pages"] == 0


def test_an_unreachable_redis_is_one_line_and_exit_2(seeded: Settings) -> None:
    done = status(seeded, "--run", RUN, REDIS_URL="redis://127.0.0.1:1/0")

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Redis" in done.stderr and "Traceback" not in done.stderr


ACTIVE = "run-live"


@pytest.fixture
def active(settings: Settings) -> Settings:
    """Pages stamped relative to the database's clock: in the last minute 20 on a.example by w1
    and 10 on b.example by w2 (6 of them in another run); 90 s ago 12 on c.example by w3; ten
    minutes ago 5 by w4. Dead letters: 2 http_500 and 1 replayed timeout, and 1 http_404 recorded
    ten minutes ago."""
    db.ensure_schema(settings)
    batches = (  # (count, host, worker, seconds ago, run)
        (20, "a.example", "w1", 10, ACTIVE),
        (4, "b.example", "w2", 20, ACTIVE),
        (6, "user:pw@b.example:8080", "w2", 30, "run-other"),
        (12, "c.example", "w3", 90, ACTIVE),
        (5, "d.example", "w4", 600, ACTIVE),
    )
    with db.connect(settings) as conn:
        for count, host, worker, ago_s, run in batches:
            for n in range(count):
                url = f"https://{host}/p{n}"
                conn.execute(
                    "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id, fetched_at)"
                    " VALUES (%s, %s, %s, 200, 'bulk', %s, now() - make_interval(secs => %s))",
                    (run, url, url, worker, ago_s),
                )
        for url, reason in (("e1", "http_500"), ("e2", "http_500"), ("e3", "timeout")):
            body = CrawlTask(url=f"https://a.example/{url}", run_id=ACTIVE, queue="bulk").encode()
            delivery = Delivery("dead", body, Failure(reason).to_headers(), redelivered=False)
            store.upsert(conn, record_from_delivery(delivery, settings.crawl_namespace))
        conn.execute("UPDATE dead_letters SET state = 'replayed' WHERE reason = 'timeout'")
        body = CrawlTask(url="https://a.example/old", run_id=ACTIVE, queue="bulk").encode()
        delivery = Delivery("dead", body, Failure("http_404").to_headers(), redelivered=False)
        store.upsert(conn, record_from_delivery(delivery, settings.crawl_namespace))
        conn.execute(
            "UPDATE dead_letters SET last_failed_at = now() - interval '10 minutes' WHERE reason = 'http_404'"
        )
    return settings


def test_json_report_has_the_recent_activity_of_every_run(active: Settings) -> None:
    done = status(active, "--json", RABBITMQ_MANAGEMENT_URL=CLOSED_PORT_HTTP)

    assert done.returncode == 0, done.stderr
    activity = json.loads(done.stdout)["activity"]
    assert activity["pages_in_window"] == 30
    assert activity["pages_per_s"] == 0.5  # 30 pages over the 60 s window
    assert activity["top_domains"] == [
        {"domain": "a.example", "pages": 20},
        {"domain": "b.example", "pages": 10},
    ]
    # w3 stored its pages 90 s ago, w4 ten minutes ago: outside the window
    assert activity["pages_by_worker"] == {"w1": 20, "w2": 10}
    assert activity["dead_letters"] == {"http_500": 2}  # not the http_404 of ten minutes ago


def test_with_a_run_the_activity_is_that_runs(active: Settings) -> None:
    done = status(active, "--run", ACTIVE, "--json", RABBITMQ_MANAGEMENT_URL=CLOSED_PORT_HTTP)

    assert done.returncode == 0, done.stderr
    activity = json.loads(done.stdout)["activity"]
    assert activity["pages_in_window"] == 24
    assert activity["pages_per_s"] == 0.4
    assert [d["pages"] for d in activity["top_domains"]] == [20, 4]
    assert activity["pages_by_worker"] == {"w1": 20, "w2": 4}


def test_watch_redraws_until_ctrl_c_and_exits_0(active: Settings) -> None:
    env = {
        **os.environ,
        "PG_SCHEMA": active.pg_schema,
        "CRAWL_NAMESPACE": active.crawl_namespace,
        "REDIS_PREFIX": active.redis_prefix,
        "COLUMNS": "80",  # the frame is fitted to the terminal; these stand in for one
        "LINES": "24",
        "DATABASE_URL": active.database_url,
        "RABBITMQ_MANAGEMENT_URL": CLOSED_PORT_HTTP,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.status", "--watch", "--interval", "0.2"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        shown: list[str] = []
        deadline = time.monotonic() + 30
        while sum("Ctrl-C to stop" in line for line in shown) < 3:  # each frame ends with it
            assert time.monotonic() < deadline, "the view was not redrawn"
            shown.append(process.stdout.readline())
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    frames = "".join([*shown, rest]).split(CLEAR_SCREEN)[1:]
    assert len(frames) >= 3
    for frame in frames[:-1]:  # the last one may have been cut short by Ctrl-C
        assert "pages/s        0.50  (30 pages)" in frame
        assert "dead letters   http_500=2" in frame
        assert "workers running: none" in frame
        lines = frame.split("\n")
        assert len(lines) <= 24, frame
        assert max(map(len, lines)) <= 80, frame
