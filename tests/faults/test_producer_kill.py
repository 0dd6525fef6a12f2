"""The producer killed with SIGKILL at random points of its publish, and run again at once each
time with the same run id: every URL reaches the queue, none is skipped, each is stored or dead
exactly once, and the figures say how many copies the broker got.

Only this test's own producer processes are killed; no service is stopped or restarted.

    FAULTS_SIZE=small: 5,000 URLs (the default)      FAULTS_SIZE=large: 50,000 URLs
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
import redis

from shared import broker, db
from shared.keys import Keys
from shared.settings import Settings
from shared.topology import build_topology
from tests.faults.conftest import SIZE, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import queued_messages, wait_for_ledger
from tests.faults.site import FaultSite, SiteShape

pytestmark = [pytest.mark.faults, pytest.mark.timeout(SIZE.timeout_s + 360)]

URLS = {"small": 5_000, "large": 50_000}[SIZE.name]
KILLS = 10
ALWAYS_500 = 10
WORKERS = 2
SITEMAPS = 20  # each read with a pause, so that a publish takes a while and kills land inside it
RUN = "killed-producer"


def run_counters(settings: Settings) -> dict[str, int]:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        raw = client.hgetall(Keys(settings.redis_prefix).run_stats(RUN))
    finally:
        client.close()
    return {str(key): int(value) for key, value in raw.items()}  # str already: decode_responses


def kill_after(procs: Fleet, settings: Settings, published: int, site_args: list[str]) -> int:
    """Start a producer; SIGKILL it once it has added `published` messages to the queues.
    Returns the messages queued at the kill, or -1 when the producer finished first."""
    target = queued_messages(settings) + published
    producer = procs.producer(RUN, *site_args)
    while (queued := queued_messages(settings)) < target:
        if producer.poll() is not None:
            return -1
        time.sleep(0.02)
    producer.kill()
    producer.wait()
    return queued


def test_sigkilled_producer_rerun_at_once_loses_and_doubles_nothing(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    web = site(
        SiteShape(
            pages=URLS - ALWAYS_500,
            always_500=ALWAYS_500,
            urls_per_sitemap=URLS // SITEMAPS,
            sitemap_delay_s=0.05,
        )
    )
    procs = fleet(env())
    connection = broker.connect(settings, "faults-setup")  # the queues are counted from the start
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()
    db.ensure_schema(settings)  # the ledger is read before the workers start
    site_args = ["--sitemap", web.sitemap_index]
    started = time.monotonic()

    # Publish with no worker running, so the queues hold exactly what the broker received.
    chaos = random.Random(16)
    steps = [chaos.randint(URLS // 40, URLS // 10) for _ in range(KILLS)]
    killed_at = [kill_after(procs, settings, step, site_args) for step in steps]
    final = procs.producer(RUN, *site_args)
    assert final.wait(timeout=300) == 0
    summary = procs.producer_summary(RUN)
    publish_s = time.monotonic() - started
    received = queued_messages(settings)
    counters = run_counters(settings)
    enqueued = sum(n for name, n in counters.items() if name.startswith("enqueued."))

    # Crawl it.
    procs.start_services(WORKERS)
    ledger = wait_for_ledger(
        settings, RUN, web.urls(), max(size.settle_s, URLS / 40), check=procs.assert_alive
    )
    counters = run_counters(settings)
    hits = web.page_hits()
    healthy_extra = sum(n - 1 for path, n in hits.items() if "/pages/" in path)
    broken_extra = sum(n - 3 for path, n in hits.items() if "/always500/" in path)
    copies = received - URLS
    report(
        **ledger.figures(),
        kills=len([k for k in killed_at if k >= 0]),
        killed_at_queued=killed_at,
        broker_received=received,
        enqueued=enqueued,
        taken_over=counters.get("taken_over", 0),
        republished=counters.get("republished", 0),
        copies=copies,
        handled_again=copies - counters.get("duplicate_deliveries", 0),
        duplicate_deliveries=counters.get("duplicate_deliveries", 0),
        extra_fetches=healthy_extra + broken_extra,
        final_run={k: summary[k] for k in ("enqueued_total", "duplicates", "taken_over", "republished")},
        publish_s=round(publish_s, 1),
        elapsed_s=round(time.monotonic() - started, 1),
    )
    assert all(k >= 0 for k in killed_at), "a producer finished before its kill: the kill tested nothing"
    # Every URL reached the broker, counted once however many producers it took. Each copy the
    # broker got beyond that follows a takeover, which the claim counts as it happens.
    assert enqueued == URLS
    assert URLS <= received <= URLS + counters.get("taken_over", 0)
    assert copies > 0, "no kill left a published URL unmarked: the scenario tested nothing"
    # Each URL has exactly one outcome.
    ledger.assert_every_url_once()
    assert len(ledger.stored) == URLS - ALWAYS_500
    assert ledger.dead_by_reason() == {"http_500": ALWAYS_500}
    # Exact accounting of the copies: each is acked unfetched as a duplicate delivery once its
    # URL is settled. Only a copy handled while its first was still in flight, or of a URL that
    # ended dead, is handled again: at most one fetch (three for a 500) per such copy.
    handled_again = copies - counters.get("duplicate_deliveries", 0)
    assert received == enqueued + counters.get("duplicate_deliveries", 0) + handled_again
    assert 0 <= handled_again <= ALWAYS_500 + copies // 100, f"{handled_again} copies handled again"
    assert healthy_extra <= handled_again
