"""Redis restarted mid-run without persistence (dedup, rate limits, cache and robots.txt state all
forgotten): workers pause while it is gone and carry on, the producer waits and goes on
publishing, and no URL is lost or stored twice."""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import OUTAGE_TIMEOUT_S
from tests.faults.ledger import outcomes_so_far
from tests.faults.outages import redis_stopped
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape

pytestmark = pytest.mark.timeout(OUTAGE_TIMEOUT_S)

WORKERS = 4
DOWN_S = 3.0


def test_a_redis_restart_loses_and_doubles_nothing(services_to_ourselves: None, scenario: Scenario) -> None:
    settings, size, report = scenario.settings, scenario.size, scenario.report
    crawl = scenario.crawling("redis", SiteShape.slow(size.urls), WORKERS)
    procs, producer = crawl.procs, crawl.producer
    crawl.wait_for_progress(size.urls // 20)
    assert producer.poll() is None, "the producer finished before the restart: nothing to test"

    with redis_stopped(settings):
        before = outcomes_so_far(settings, "redis")
        time.sleep(DOWN_S)
        # Workers finish what they had past Redis, then wait: little gets done while it is gone.
        during = outcomes_so_far(settings, "redis") - before
    back_at = time.monotonic()
    crawl.wait_for_progress(before + during + 1)
    resumed_s = time.monotonic() - back_at

    summary = crawl.producer_finished(size.settle_s)
    ledger = crawl.ledger()
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
