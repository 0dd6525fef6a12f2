"""Redis restarted mid-run without persistence (dedup, rate limits, cache and robots.txt state all
forgotten): workers pause while it is gone and carry on, the producer waits and goes on
publishing, and no URL is lost or stored twice."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from shared.settings import Settings
from tests.faults.conftest import OUTAGE_TIMEOUT_S, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import outcomes_so_far, wait_for_ledger, wait_for_progress
from tests.faults.outages import redis_stopped
from tests.faults.site import FaultSite, SiteShape

pytestmark = [pytest.mark.faults, pytest.mark.timeout(OUTAGE_TIMEOUT_S)]

WORKERS = 4
DOWN_S = 3.0


def test_a_redis_restart_loses_and_doubles_nothing(
    services_to_ourselves: None,
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    web = site(SiteShape.slow(size.urls))
    procs = fleet(env())
    procs.start_services(WORKERS)
    producer = procs.producer("redis", "--sitemap", web.sitemap_index)
    wait_for_progress(settings, "redis", size.urls // 20, size.settle_s, procs.assert_alive)
    assert producer.poll() is None, "the producer finished before the restart: nothing to test"

    with redis_stopped(settings):
        before = outcomes_so_far(settings, "redis")
        time.sleep(DOWN_S)
        # Workers finish what they had past Redis, then wait: little gets done while it is gone.
        during = outcomes_so_far(settings, "redis") - before
    back_at = time.monotonic()
    wait_for_progress(settings, "redis", before + during + 1, size.settle_s, procs.assert_alive)
    resumed_s = time.monotonic() - back_at

    assert producer.wait(timeout=size.settle_s) == 0
    summary = procs.producer_summary("redis")
    ledger = wait_for_ledger(settings, "redis", web.urls(), size.settle_s, check=procs.assert_alive)
    report(
        **ledger.figures(),
        down_s=DOWN_S,
        outcomes_while_down=during,
        resumed_s=round(resumed_s, 1),
        enqueued=summary["enqueued_total"],
        worker_pauses=len(procs.log_lines("worker", "paused: cannot reach Redis")),
        tracebacks=len(procs.log_lines("", "Traceback")),
    )
    assert summary["enqueued_total"] == size.urls and summary["publish_failed"] == 0
    ledger.assert_every_url_once()
    assert len(ledger.stored) == size.urls
    assert procs.log_lines("", "Traceback") == []
