"""PostgreSQL stopped mid-run: workers and the dead-letter consumer hold their messages unacked
and back off, nothing is acked that was not committed, and no healthy URL is dead-lettered."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from shared.settings import Settings
from tests.faults.conftest import OUTAGE_TIMEOUT_S, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import outcomes_so_far, wait_for_ledger, wait_for_progress
from tests.faults.outages import postgres_stopped
from tests.faults.site import FaultSite, SiteShape

pytestmark = [pytest.mark.faults, pytest.mark.timeout(OUTAGE_TIMEOUT_S)]

WORKERS = 4
ALWAYS_500 = 10


def test_a_database_outage_pauses_work_and_dead_letters_nothing_healthy(
    services_to_ourselves: None,
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    pages = size.urls - ALWAYS_500
    web = site(SiteShape(pages=pages, always_500=ALWAYS_500, page_delay_s=0.02))
    procs = fleet(env())
    procs.start_services(WORKERS)
    producer = procs.producer("pg", "--sitemap", web.sitemap_index)
    wait_for_progress(settings, "pg", size.urls // 5, size.settle_s, procs.assert_alive)
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
    wait_for_progress(settings, "pg", resumed_at + 1, size.settle_s, procs.assert_alive)
    resumed_s = time.monotonic() - back_at

    assert producer.wait(timeout=size.settle_s) == 0
    ledger = wait_for_ledger(settings, "pg", web.urls(), size.settle_s, check=procs.assert_alive)
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
