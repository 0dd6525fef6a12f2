"""Status against the real services: the queues that exist, a run's counters under whatever
prefix it used, and the workers that are running now."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
import redis

from ops.management import HttpGet
from ops.runs import pause
from ops.status import KNOWN_PREFIXES, gather
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.redis.keys import Keys
from shared.redis.presence import PRESENCE_TTL_S, announced
from shared.redis.runstate import held_queue
from shared.settings import Settings
from tests.conftest import cleanup, unique_name

CLOSED_PORT_HTTP = "http://127.0.0.1:1"


def declared(settings: Settings) -> None:
    connection = broker.connect(settings, "test-status")
    broker.declare_topology(connection, build_topology(settings))
    connection.close()


def roles(report: dict[str, object]) -> dict[str, tuple[str, bool]]:
    return {q["name"]: (q["role"], q["exists"]) for q in report["queues"]}  # type: ignore[attr-defined]


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    made = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    yield made
    made.close()


def test_without_the_api_every_queue_has_its_own_role(settings: Settings) -> None:
    declared(settings)
    ns = settings.crawl_namespace

    report = gather(dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP), None)

    assert report["queue_source"] == "amqp"
    assert roles(report) == {
        f"{ns}.priority": ("work", True),
        f"{ns}.ttl": ("work", True),
        f"{ns}.bulk": ("work", True),
        f"{ns}.render": ("work", True),
        f"{ns}.discovery": ("discovery", True),
        f"{ns}.dead": ("dead", True),
        f"{ns}.parked": ("parked", True),
        f"{ns}.control.runs": ("control", True),
        f"{ns}.retry.500ms": ("retry", True),
        f"{ns}.retry.1000ms": ("retry", True),
        f"{ns}.defer.1000ms": ("defer", True),
        f"{ns}.defer.5000ms": ("defer", True),
        f"{ns}.defer.30000ms": ("defer", True),
    }
    assert list(roles(report)) == [q["name"] for q in report["queues"]]  # in this order


def test_the_api_lists_the_queues_that_exist_not_the_ones_settings_imply(
    settings: Settings, management_api: HttpGet
) -> None:
    declared(settings)  # retry queues of 0.5 s and 1 s
    longer = dataclasses.replace(settings, crawl_namespace=f"{settings.crawl_namespace}.x")
    declared(longer)  # another pipeline whose names start with ours
    asking = dataclasses.replace(settings, retry_delays_s=(7.0,))
    ns = settings.crawl_namespace
    try:
        report = gather(asking, None, management_api)
    finally:
        cleanup(longer)  # its queues and exchanges; its keys and schema are this test's own

    assert report["queue_source"] == "management"
    shown = roles(report)
    assert shown[f"{ns}.retry.500ms"] == ("retry", True)
    assert shown[f"{ns}.retry.1000ms"] == ("retry", True)
    assert f"{ns}.retry.7000ms" not in shown
    assert shown[f"{ns}.parked"] == ("parked", True)
    assert not any(name.startswith(f"{ns}.x.") for name in shown)


def test_the_work_dead_and_parked_queues_show_as_missing_the_delay_queues_not_at_all(
    settings: Settings,
) -> None:
    report = gather(dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP), None)

    ns = settings.crawl_namespace
    assert roles(report) == {
        f"{ns}.priority": ("work", False),
        f"{ns}.ttl": ("work", False),
        f"{ns}.bulk": ("work", False),
        f"{ns}.dead": ("dead", False),
        f"{ns}.parked": ("parked", False),
    }


@pytest.mark.parametrize(
    ("where", "name"), [("scanned", "run-"), ("demo", "run-"), ("scanned", "run-[a]*?-")]
)
def test_a_runs_counters_are_found_under_the_prefix_it_used(
    settings: Settings, client: redis.Redis, where: str, name: str
) -> None:
    run_id = unique_name(name)  # glob characters in a run id match only themselves
    prefix = f"{settings.redis_prefix}-elsewhere" if where == "scanned" else "demo"
    assert prefix == "demo" or prefix not in KNOWN_PREFIXES
    key = Keys(prefix).run_stats(run_id)
    client.hset(key, mapping={"enqueued.bulk": 87, "duplicates": 3})
    try:
        report = gather(dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP), run_id)
    finally:
        client.delete(key)

    assert report["run"]["redis_prefix"] == prefix
    assert report["run"]["counters"] == {"duplicates": 3, "enqueued.bulk": 87}


def test_a_run_without_counters_says_so(settings: Settings) -> None:
    report = gather(dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP), "no-such-run")

    assert (report["run"]["redis_prefix"], report["run"]["counters"]) == (None, {})


def test_a_running_worker_is_listed_and_leaves_the_list_when_it_stops(
    settings: Settings, client: redis.Redis
) -> None:
    quick = dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP)
    one = dataclasses.replace(settings, worker_id="w-one")
    two = dataclasses.replace(settings, worker_id="w-two")

    restarts = {"browser_restarts": 2}  # what a renderer reports of itself
    with announced(one, heartbeat_s=0.1), announced(two, heartbeat_s=0.1, figures=lambda: restarts):
        time.sleep(0.3)  # a few beats
        running = gather(quick, None)["workers"]
        ttl_ms = client.pttl(Keys(settings.redis_prefix).worker("w-one"))
    stopped = gather(quick, None)["workers"]

    assert [w["worker_id"] for w in running] == ["w-one", "w-two"]
    assert all(w["pages_in_window"] == 0 for w in running)
    assert "browser_restarts" not in running[0] and running[1]["browser_restarts"] == 2
    assert 0 < ttl_ms <= PRESENCE_TTL_S * 1000
    assert stopped == []
    assert client.exists(Keys(settings.redis_prefix).worker("w-one")) == 0


def test_without_redis_the_overview_still_shows_and_says_workers_are_unknown(settings: Settings) -> None:
    report = gather(
        dataclasses.replace(
            settings, rabbitmq_management_url=CLOSED_PORT_HTTP, redis_url="redis://127.0.0.1:1/0"
        ),
        None,
    )

    assert report["workers"] is None
    assert report["queue_source"] == "amqp"


def test_a_paused_runs_hold_queue_is_shown_with_role_held(
    settings: Settings, client: redis.Redis, management_api: HttpGet
) -> None:
    declared(settings)
    run_id = unique_name("run-")
    pause(settings, client, Keys(settings.redis_prefix), run_id)
    hold = held_queue(settings.crawl_namespace, run_id)
    try:
        listed = gather(settings, None, management_api)
        asked = gather(dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP), run_id)
    finally:
        connection = broker.connect(settings, "test-status")
        connection.channel().queue_delete(hold)
        connection.close()

    assert listed["queue_source"] == "management"
    assert roles(listed)[hold] == ("held", True)
    assert list(roles(listed))[-1] == hold  # after the delay queues
    assert asked["queue_source"] == "amqp"
    assert roles(asked)[hold] == ("held", True)


def test_a_worker_s_problem_rides_with_its_presence(settings: Settings) -> None:
    quick = dataclasses.replace(settings, rabbitmq_management_url=CLOSED_PORT_HTTP, worker_id="w-full")
    with announced(quick, heartbeat_s=0.1, problem=lambda: "WARC_DIR /w is full"):
        time.sleep(0.3)
        (worker,) = gather(quick, None)["workers"]
    assert worker["problem"] == "WARC_DIR /w is full"
