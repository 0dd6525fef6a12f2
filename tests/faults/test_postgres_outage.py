"""PostgreSQL stopped mid-run: workers and the dead-letter consumer hold their messages unacked
and back off, nothing is acked that was not committed, and no healthy URL is dead-lettered."""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import OUTAGE_TIMEOUT_S
from tests.faults.ledger import outcomes_so_far
from tests.faults.outages import postgres_stopped
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape

pytestmark = pytest.mark.timeout(OUTAGE_TIMEOUT_S)

WORKERS = 4
ALWAYS_500 = 10


def test_a_database_outage_pauses_work_and_dead_letters_nothing_healthy(
    services_to_ourselves: None, scenario: Scenario
) -> None:
    settings, size, report = scenario.settings, scenario.size, scenario.report
    pages = size.urls - ALWAYS_500
    crawl = scenario.crawling("pg", SiteShape(pages=pages, always_500=ALWAYS_500, page_delay_s=0.02), WORKERS)
    web, procs = crawl.web, crawl.procs
    crawl.wait_for_progress(size.urls // 5)
    fetches_before = sum(web.page_hits().values())

    with postgres_stopped():
        stopped_at = time.monotonic()
        time.sleep(size.postgres_outage_s)
        # Fetching stops soon too: a worker holds at most its prefetch of messages unacked, and
        # those wait for their rows' commit.
        fetched_while_down = sum(web.page_hits().values()) - fetches_before
    outage_s = time.monotonic() - stopped_at
    back_at = time.monotonic()
    resumed_at = outcomes_so_far(settings, "pg")
    crawl.wait_for_progress(resumed_at + 1)
    resumed_s = time.monotonic() - back_at

    crawl.producer_finished(size.settle_s)
    ledger = crawl.ledger()
    report(
        **ledger.figures(),
        outage_s=round(outage_s, 1),
        fetched_while_down=fetched_while_down,
        resumed_s=round(resumed_s, 1),
        write_retries=len(procs.log_lines("worker", "cannot store")),
        pauses=len(procs.log_lines("", "paused: cannot reach PostgreSQL")),
    )
    ledger.assert_every_url_once()
    assert len(ledger.stored) == pages and set(ledger.stored.values()) == {0}
    # Only the always-500 URLs are dead, after three real failures: the outage cost nobody an attempt.
    assert ledger.dead_by_reason() == {"http_500": ALWAYS_500}
    assert {d.attempts for d in ledger.dead.values()} == {3}
