"""The dashboard against the real services, served by uvicorn from a thread, under names of
its own: its API against the CLIs' figures, replay and purge against the store, the actions
on a run, the audit rows, and the live streams (five viewers, one sample per interval)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import psycopg
import pytest

from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord
from dlq_consumer.replay import replay
from ops.accounting import account
from ops.dashboard.text import whole
from ops.status import gather
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.messages import CrawlTask
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import PAUSED, RUNNING, held_queue, read_state
from shared.settings import Settings
from tests.dashboard_server import Served, served

pytestmark = pytest.mark.integration

RUN = "dash-run"


@pytest.fixture
def seeded(settings: Settings) -> Iterator[Settings]:
    """A run with 10 URLs enqueued: 4 stored, 5 dead letters (3 http_500, 2 http_404), 1 to go."""
    db.ensure_schema(settings)
    client = connect_redis(settings, OPERATOR)
    client.hset(Keys(settings.redis_prefix).run_stats(RUN), mapping={"enqueued.bulk": 10})
    client.close()
    with db.connect(settings) as conn:
        for n in range(4):
            conn.execute(
                "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id) "
                "VALUES (%s, %s, %s, 200, 'bulk', 'w1')",
                (RUN, f"https://a.example/{n}", f"https://a.example/{n}"),
            )
        for n, reason in enumerate(["http_500"] * 3 + ["http_404"] * 2):
            add_dead_letter(conn, settings, f"https://a.example/dead/{n}", reason)
        conn.commit()
    yield settings


def add_dead_letter(conn: psycopg.Connection[Any], settings: Settings, url: str, reason: str) -> None:
    body = CrawlTask(url=url, run_id=RUN, queue="bulk").encode()
    store.upsert(
        conn,
        DeadLetterRecord(
            RUN,
            url,
            reason,
            "HTTP 500 from the site",
            500 if reason == "http_500" else 404,
            3,
            0,
            f"{settings.crawl_namespace}.bulk",
            "w1",
            body,
            None,
            None,
            len(body),
        ),
    )


@pytest.fixture
def dashboard(seeded: Settings) -> Iterator[Served]:
    with served(seeded, refresh_s=0.2) as running:
        yield running


def states(settings: Settings) -> dict[str, int]:
    with db.connect(settings, autocommit=True) as conn:
        return {
            str(s): whole(n)
            for s, n in conn.execute(
                "SELECT state, count(*) FROM dead_letters WHERE run_id = %s GROUP BY state", (RUN,)
            )
        }


def wait_for_operation(dashboard: Served, op_id: str, timeout_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        op: dict[str, Any] = httpx.get(f"{dashboard.url}/api/v1/operations/{op_id}").json()
        if op["state"] != "running":
            return op
        assert time.monotonic() < deadline, op
        time.sleep(0.1)


def test_the_api_answers_what_the_clis_read(dashboard: Served, seeded: Settings) -> None:
    overview = httpx.get(f"{dashboard.url}/api/v1/overview").json()
    expected = gather(seeded, None)
    assert overview["runs"] == expected["runs"]
    assert [q["name"] for q in overview["queues"]] == [q["name"] for q in expected["queues"]]
    run = httpx.get(f"{dashboard.url}/api/v1/runs/{RUN}").json()
    figures = account(seeded, RUN)
    assert (run["stored"], run["dead"], run["skipped"]) == (figures.stored, figures.dead, figures.skipped)
    assert run["dead_letters"] == {"http_404": 2, "http_500": 3}
    assert (run["enqueued"], run["left"], run["state"]) == (10, 1, "running")
    assert run["identity"]["holds"] and not run["identity"]["ok"]
    listed = httpx.get(f"{dashboard.url}/api/v1/runs").json()
    assert [(r["run_id"], r["stored"], r["dead"], r["left"]) for r in listed] == [(RUN, 4, 5, 1)]
    stats = httpx.get(f"{dashboard.url}/stats", params={"run": RUN}).json()
    assert stats["tasks"] == {"enqueued": 10, "stored": 4, "dead": 5, "skipped": 0, "left": 1, "queued": 0}
    assert set(stats) == {"workers", "tasks", "throughput"} and stats["throughput"]["window_s"] == 60
    assert httpx.get(f"{dashboard.url}/workers").json() == []
    assert httpx.get(f"{dashboard.url}/readyz").json() == {"ready": True}
    domains = httpx.get(f"{dashboard.url}/api/v1/runs/{RUN}/domains").json()
    assert [(d["domain"], d["observed_per_s"], d["in_flight"]) for d in domains] == [
        ("a.example", round(4 / 60, 2), 0)
    ]
    timeline = httpx.get(f"{dashboard.url}/api/v1/runs/{RUN}/timeline").json()
    assert sum(p["stored"] for p in timeline) == 4 and sum(p["dead"] for p in timeline) == 5


def test_dead_letters_filter_page_and_export(dashboard: Served) -> None:
    url = f"{dashboard.url}/api/v1/dead-letters"
    rows = httpx.get(url, params={"run": RUN, "reason": "http_500"}).json()
    assert [r["reason"] for r in rows] == ["http_500"] * 3
    first = httpx.get(url, params={"run": RUN, "limit": 2}).json()
    rest = httpx.get(url, params={"run": RUN, "after_id": first[-1]["id"]}).json()
    assert len(first) + len(rest) == 5 and {r["id"] for r in first}.isdisjoint(r["id"] for r in rest)
    summary = httpx.get(f"{url}/summary", params={"run": RUN}).json()
    assert {(s["reason"], s["count"]) for s in summary} == {("http_500", 3), ("http_404", 2)}
    one = httpx.get(f"{url}/{rows[0]['id']}").json()
    assert one["task"]["url"] == rows[0]["url"] and len(one["body_sha256"]) == 64
    lines = httpx.get(f"{dashboard.url}/api/v1/dead-letters.jsonl", params={"run": RUN}).text.splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["run_id"] == RUN
    assert (
        len(httpx.get(f"{dashboard.url}/api/v1/dead-letters.csv", params={"run": RUN}).text.splitlines()) == 6
    )
    assert httpx.get(url, params={"q": "dead"}).status_code == 400  # URL search alone: unbounded


def test_replay_counts_first_refuses_a_changed_selection_and_leaves_later_rows(
    dashboard: Served, seeded: Settings
) -> None:
    url = f"{dashboard.url}/api/v1/dead-letters/replay"
    selection = {"run_id": RUN, "reason": "http_500"}
    dry = httpx.post(url, json={"selection": selection, "dry_run": True}).json()
    with db.connect(seeded) as conn:
        assert dry["would_replay"] == store.count(conn, store.Selection(RUN, "http_500")) == 3
        # One of the three is replayed from the command line meanwhile: the count shown is stale.
        replay(conn, lambda p: None, store.Selection(RUN, "http_500", limit=1), seeded.crawl_namespace)
    stale = httpx.post(url, json={**selection, "expected": 3, "max_id": dry["max_id"]})
    assert stale.status_code == 409 and stale.json()["now"] == 2
    dry = httpx.post(url, json={"selection": selection, "dry_run": True}).json()
    with db.connect(seeded) as conn:
        add_dead_letter(conn, seeded, "https://a.example/dead/late", "http_500")  # after the dry run
        conn.commit()
    done = httpx.post(url, json={**selection, "expected": 2, "max_id": dry["max_id"]})
    assert done.status_code == 202
    assert wait_for_operation(dashboard, done.json()["operation"])["result"]["replayed"] == 2
    assert states(seeded) == {"replayed": 3, "dead": 3}  # 2 http_404 and the late http_500
    connection = broker.connect(seeded, "test")
    broker.declare_topology(connection, build_topology(seeded))
    assert broker.queue_depth(connection.channel(), f"{seeded.crawl_namespace}.bulk")[0] == 2
    connection.close()
    with db.connect(seeded, autocommit=True) as conn:
        audit = conn.execute(
            "SELECT actor, action, run_id, expected, result->>'replayed' FROM operator_actions ORDER BY id"
        ).fetchall()
    assert audit == [("operator", "replay", RUN, 2, "2")]


def test_purge_defaults_to_replayed_rows_and_dead_ones_need_include_dead(
    dashboard: Served, seeded: Settings
) -> None:
    url = f"{dashboard.url}/api/v1/dead-letters/purge"
    refused = httpx.post(url, json={"run_id": RUN, "state": "dead", "dry_run": True})
    assert refused.status_code == 400 and "include_dead" in refused.json()["error"]
    dry = httpx.post(url, json={"run_id": RUN, "state": "dead", "include_dead": True, "dry_run": True}).json()
    assert (dry["would_delete"], dry["dead_outcomes_lost"]) == (5, 5)
    stale = httpx.post(
        url,
        json={"run_id": RUN, "state": "dead", "include_dead": True, "expected": 4, "max_id": dry["max_id"]},
    )
    assert stale.status_code == 409 and states(seeded) == {"dead": 5}  # rolled back
    assert httpx.post(url, json={"run_id": RUN, "dry_run": True}).json()["would_delete"] == 0  # replayed
    done = httpx.post(
        url,
        json={"run_id": RUN, "state": "dead", "include_dead": True, "expected": 5, "max_id": dry["max_id"]},
    )
    assert done.status_code == 202
    assert wait_for_operation(dashboard, done.json()["operation"])["result"] == {"deleted": 5}
    assert states(seeded) == {}


def test_pause_and_resume_change_the_state_and_the_hold_queue(dashboard: Served, seeded: Settings) -> None:
    keys = Keys(seeded.redis_prefix)
    client = connect_redis(seeded, OPERATOR)
    try:
        op = httpx.post(f"{dashboard.url}/api/v1/runs/{RUN}/pause").json()["operation"]
        assert wait_for_operation(dashboard, op)["state"] == "done"
        assert read_state(client, keys, RUN) == PAUSED
        connection = broker.connect(seeded, "test")
        assert broker.queue_depth(connection.channel(), held_queue(seeded.crawl_namespace, RUN)) == (0, 0)
        connection.close()
        assert httpx.get(f"{dashboard.url}/api/v1/runs/{RUN}").json()["state"] == "paused"
        refused = httpx.post(f"{dashboard.url}/api/v1/runs/{RUN}/cancel", json={"confirm": "wrong"})
        assert refused.status_code == 400
        op = httpx.post(f"{dashboard.url}/api/v1/runs/{RUN}/resume").json()["operation"]
        assert wait_for_operation(dashboard, op)["result"] == {"moved": 0}
        assert read_state(client, keys, RUN) == RUNNING
    finally:
        client.close()
    assert httpx.post(f"{dashboard.url}/api/v1/runs/no-such-run/pause").status_code == 404


def read_events(url: str, count: int, got: list[dict[str, Any]]) -> None:
    # A loaded machine stretches the interval to ten times a sample (several seconds): wait it out.
    with httpx.stream("GET", url, timeout=60) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("data: "):
                got.append(json.loads(line[6:]))
                if len(got) >= count:
                    return


def test_five_open_run_pages_cause_one_sample_per_interval(dashboard: Served) -> None:
    url = f"{dashboard.url}/events/runs/{RUN}"
    per_reader = 3
    got: list[dict[str, Any]] = []
    readers = [threading.Thread(target=stream_into, args=(url, per_reader, got)) for _ in range(5)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=60)
    assert len(got) == 5 * per_reader
    time.sleep(0.5)  # the last stream closed: its sampler ends and hands over its count
    samples = sum(
        n for scope, n in dashboard.dashboard.hub.samples_by_scope.items() if scope.startswith("run:")
    )
    # One sampler for the five viewers: each sample reached every viewer, so the samples taken
    # are those one viewer saw (and one the last viewer may have left unread), not five times.
    assert per_reader <= samples <= per_reader + 2
    first = [g for g in got if "run_progress" in g["regions"]]
    assert len(first) >= 5  # every viewer's first message carries every region
    assert "stored" in first[0]["regions"]["run_progress"]


def stream_into(url: str, count: int, got: list[dict[str, Any]]) -> None:
    mine: list[dict[str, Any]] = []
    read_events(url, count, mine)
    got.extend(mine)


def test_the_pages_render_with_live_data(dashboard: Served) -> None:
    html = {"Accept": "text/html"}
    for path in (
        "/",
        f"/runs/{RUN}",
        "/dead-letters",
        f"/dead-letters?run={RUN}&reason=http_404",
        "/workers",
        "/queues",
        f"/dead-letters/confirm?action=replay&run={RUN}",
    ):
        answer = httpx.get(dashboard.url + path, headers=html)
        assert answer.status_code == 200, path
        assert "Content-Security-Policy" in answer.headers
    run_page = httpx.get(f"{dashboard.url}/runs/{RUN}", headers=html).text
    assert "enqueued 10 = stored 4 + dead 5 + skipped 0 + left 1" in run_page
    assert "Replay 3" in run_page
    confirm = httpx.get(f"{dashboard.url}/dead-letters/confirm?action=replay&run={RUN}&reason=http_500").text
    assert "Replay 3 dead letters" in confirm


def control_depth(settings: Settings) -> int:
    from shared.amqp.topology import control_queue

    connection = broker.connect(settings, "test")
    broker.declare_topology(connection, build_topology(settings))
    depth = broker.queue_depth(connection.channel(), control_queue(settings.crawl_namespace))[0]
    connection.close()
    return depth


def test_a_run_is_submitted_to_the_control_queue_and_a_bad_request_is_one_line(
    dashboard: Served, seeded: Settings
) -> None:
    url = f"{dashboard.url}/api/v1/runs"
    for body, part in (
        ({}, "URL"),
        ({"sitemaps": ["not a url"]}, "not a url"),
        ({"sitemaps": ["http://169.254.169.254/latest"]}, "169.254.169.254"),
        ({"run_id": "r" * 500, "sitemaps": ["https://a.example/sitemap.xml"]}, "run_id"),
    ):
        refused = httpx.post(url, json=body)
        assert refused.status_code == 400, body
        assert part in refused.json()["error"] and "\n" not in refused.json()["error"]
    huge = httpx.post(url, content=b'{"urls": ["' + b"a" * (1 << 20) + b'"]}')
    assert (huge.status_code, huge.json()) == (400, {"error": "the request body is over 1 MiB"})
    assert control_depth(seeded) == 0  # nothing queued
    accepted = httpx.post(url, json={"run_id": "submitted-1", "sitemaps": ["https://a.example/sitemap.xml"]})
    assert accepted.status_code == 202
    assert accepted.json()["run_id"] == "submitted-1" and accepted.json()["operation"]
    assert control_depth(seeded) == 1
    with db.connect(seeded, autocommit=True) as conn:
        row = conn.execute("SELECT action, run_id FROM operator_actions WHERE action = 'submit'").fetchone()
    assert row == ("submit", "submitted-1")
