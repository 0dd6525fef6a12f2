"""SIGTERM to every process at once, under load: all exit within the bound, every URL in flight
is committed and acked or returned, and a restart with the same run id finishes the run."""

from __future__ import annotations

import pytest

from tests.faults.conftest import SIZE
from tests.faults.fleet import STOP_BOUND_S
from tests.faults.ledger import outcomes_so_far, wait_for_ledger
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

WORKERS = 4


def test_sigterm_to_everything_exits_in_time_and_loses_nothing(scenario: Scenario) -> None:
    settings, size, report = scenario.settings, scenario.size, scenario.report
    crawl = scenario.crawling("sigterm", SiteShape.slow(size.urls), WORKERS)
    web, first, producer = crawl.web, crawl.procs, crawl.producer
    crawl.wait_for_progress(size.urls // 10)
    assert producer.poll() is None, "the producer finished before the stop: nothing to test"

    exits = first.stop(extra={"producer": producer})
    at_stop = outcomes_so_far(settings, "sigterm")
    interrupted = first.producer_summary("sigterm")
    # The services stop cleanly with 0; the producer, stopped mid-run, says so with 143 (128 + SIGTERM).
    assert {name: e.code for name, e in exits.items()} == {**dict.fromkeys(exits, 0), "producer": 143}
    slowest = max(e.seconds for e in exits.values())
    assert slowest <= STOP_BOUND_S
    assert interrupted["stopped_early"] is True

    # The same run id again: the producer publishes only what it had not, the workers finish.
    second = scenario.fleet(scenario.env())
    second.start_services(WORKERS)
    assert second.producer("sigterm", "--sitemap", web.sitemap_index).wait(timeout=size.settle_s) == 0
    resumed = second.producer_summary("sigterm")
    ledger = wait_for_ledger(settings, "sigterm", web.urls(), size.settle_s, check=second.assert_alive)
    report(
        **ledger.figures(),
        exit_s={name: round(e.seconds, 2) for name, e in exits.items()},
        outcomes_at_stop=at_stop,
        enqueued_before_stop=interrupted["enqueued_total"],
        enqueued_after_restart=resumed["enqueued_total"],
        duplicates_skipped_after_restart=resumed["duplicates"],
    )
    ledger.assert_every_url_once()
    assert len(ledger.stored) == size.urls
    # Each URL was published once: what the first producer confirmed, the second skipped.
    assert interrupted["enqueued_total"] + resumed["enqueued_total"] == size.urls
