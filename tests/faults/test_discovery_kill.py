"""Workers and the frontier killed with SIGKILL at random moments of a discovery crawl: no link
is lost, no URL has two outcomes, and the URLs reached are the site's whole graph, as an
undisturbed crawl finds it (the e2e test tests/e2e/test_discovery.py holds a crawl to the
breadth-first answer; this graph's answer is every page).

    FAULTS_SIZE=small: 2,000 pages      FAULTS_SIZE=large: 20,000 pages
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from shared.settings import Settings
from tests.faults.conftest import SIZE, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import outcomes_so_far, wait_for_ledger, wait_for_progress
from tests.faults.site import GraphSite

pytestmark = [pytest.mark.faults, pytest.mark.timeout(SIZE.timeout_s)]

PAGES = {"small": 2_000, "large": 20_000}[SIZE.name]
WORKERS = 4
KILL_AT = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85)  # shares of the pages stored


def test_sigkilled_workers_and_frontier_lose_and_double_no_discovered_url(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    with GraphSite(PAGES) as web:
        everything = [web.url(f"/p/{n}") for n in range(PAGES)]
        procs = fleet(env())
        started = time.monotonic()
        procs.start_services(WORKERS)
        frontiers = 1
        procs.start("frontier-1", "producer", "--frontier")
        producer = procs.producer(
            "discover", "--start", web.url("/p/0"), "--max-depth", "60", "--max-pages", "0"
        )
        assert producer.wait(timeout=60) == 0

        chaos = random.Random(42)
        killed: list[str] = []
        for share in KILL_AT:
            wait_for_progress(settings, "discover", int(share * PAGES), size.settle_s, procs.assert_alive)
            time.sleep(chaos.uniform(0, 0.3))  # a random moment, not only a round figure
            for victim in [*chaos.sample(procs.workers(), 2), f"frontier-{frontiers}"]:
                procs.kill(victim)
                killed.append(victim)
                if victim.startswith("frontier"):
                    frontiers += 1
                    procs.start(f"frontier-{frontiers}", "producer", "--frontier")
                else:
                    procs.replace(victim)
        ledger = wait_for_ledger(settings, "discover", everything, size.settle_s, check=procs.assert_alive)
        report(
            **ledger.figures(),
            pages=PAGES,
            sigkills=len(killed),
            # Restarted frontiers that took over claims a killed one left: kills mid-publish.
            frontier_takeovers=len(procs.log_lines("frontier", "took over")),
            outcomes_at_end=outcomes_so_far(settings, "discover"),
            elapsed_s=round(time.monotonic() - started, 1),
        )
        ledger.assert_every_url_once()
        assert set(ledger.stored) == set(everything)
        assert not ledger.dead and not ledger.skipped
