"""Workers killed with SIGKILL mid-run: their unacked URLs go to other workers, nothing is lost,
nothing is stored twice, and a crash is never charged to a URL as a failure."""

from __future__ import annotations

import random
import time

import pytest

from tests.faults.conftest import SIZE
from tests.faults.ledger import outcomes_so_far
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

WORKERS = 4
ROUNDS = 5
KILLED_PER_ROUND = 2
ALWAYS_500 = 20
# Kill when this share of the URLs has an outcome: spread over the run whatever its speed.
KILL_AT = (0.1, 0.25, 0.4, 0.55, 0.7)


def test_sigkilled_workers_lose_and_double_nothing(scenario: Scenario) -> None:
    settings, size, report = scenario.settings, scenario.size, scenario.report
    started = time.monotonic()
    # A short page delay keeps fetches in flight, so kills land mid-fetch as well as mid-write.
    shape = SiteShape(pages=size.crash_urls - ALWAYS_500, always_500=ALWAYS_500, page_delay_s=0.02)
    crawl = scenario.crawling("crash", shape, WORKERS)
    web, procs = crawl.web, crawl.procs

    chaos = random.Random(7)
    rounds: list[dict[str, object]] = []
    for share in KILL_AT:
        crawl.wait_for_progress(int(share * size.crash_urls))
        victims = chaos.sample(procs.workers(), KILLED_PER_ROUND)
        for victim in victims:
            procs.kill(victim)
            procs.replace(victim)
        rounds.append({"at_outcomes": outcomes_so_far(settings, "crash"), "killed": victims})
    assert crawl.producer_finished(60)["enqueued_total"] == size.crash_urls

    ledger = crawl.ledger()
    elapsed = time.monotonic() - started
    redeliveries = len(procs.log_lines("worker", "redelivered "))
    fetches = sum(web.page_hits().values())
    report(
        **ledger.figures(),
        workers=WORKERS,
        sigkills=ROUNDS * KILLED_PER_ROUND,
        redeliveries=redeliveries,
        extra_fetches=fetches - size.crash_urls - 2 * ALWAYS_500,
        elapsed_s=round(elapsed, 1),
    )
    ledger.assert_every_url_once()
    assert len(rounds) == ROUNDS
    assert redeliveries > 0, "the kills found no message in flight: the scenario tested nothing"
    # Healthy pages are all stored, and none was charged a failure for a crash.
    assert len(ledger.stored) == size.crash_urls - ALWAYS_500
    assert set(ledger.stored.values()) == {0}
    # Always-500 URLs are dead after exactly three failures, crashes or not.
    assert ledger.dead_by_reason() == {"http_500": ALWAYS_500}
    assert {d.attempts for d in ledger.dead.values()} == {3}
