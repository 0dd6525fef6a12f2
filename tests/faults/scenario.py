"""What every fault scenario starts with and waits for, in one place: the local site of a given
shape, the services as processes with the scenario's environment, a producer crawling the site,
progress, and the ledger of where every URL ended. A scenario adds its fault in between.

    crawl = scenario.crawling("run", SiteShape.slow(size.urls), workers=4)
    crawl.wait_for_progress(size.urls // 20)
    ...                                           # the fault
    summary = crawl.producer_finished(size.settle_s)
    ledger = crawl.ledger()
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.settings import Settings
from tests.faults.fleet import Fleet
from tests.faults.ledger import Ledger, wait_for_ledger, wait_for_progress
from tests.faults.site import FaultSite, SiteShape

if TYPE_CHECKING:  # conftest.py, which builds a Scenario, imports this module
    from tests.faults.conftest import Size


@dataclass(frozen=True)
class Scenario:
    """One test's scenario: its names (settings), its size, and the fixtures that start its
    sites and processes and record its figures (tests/faults/conftest.py)."""

    settings: Settings
    size: Size
    env: Callable[..., dict[str, str]]
    site: Callable[[SiteShape], FaultSite]
    fleet: Callable[[dict[str, str]], Fleet]
    report: Callable[..., None]

    def services(self, shape: SiteShape, workers: int, **env: str) -> tuple[FaultSite, Fleet]:
        """A site of `shape`, and the services running (`workers` workers and the dead-letter
        consumer) with the scenario's environment and `env` on top."""
        web = self.site(shape)
        procs = self.fleet(self.env(**env))
        procs.start_services(workers)
        return web, procs

    def crawling(self, run_id: str, shape: SiteShape, workers: int, **env: str) -> Crawl:
        """services(), and a producer started on the site's sitemap as run `run_id`."""
        web, procs = self.services(shape, workers, **env)
        return Crawl(self, run_id, web, procs, procs.producer(run_id, "--sitemap", web.sitemap_index))

    def crawled(self, run_id: str, shape: SiteShape, workers: int, timeout_s: float, **env: str) -> Crawl:
        """crawling(), with the producer done (exit 0) within `timeout_s`."""
        crawl = self.crawling(run_id, shape, workers, **env)
        crawl.producer_finished(timeout_s)
        return crawl


@dataclass(frozen=True)
class Crawl:
    """A run of a scenario: its site, its processes and its producer."""

    scenario: Scenario
    run_id: str
    web: FaultSite
    procs: Fleet
    producer: subprocess.Popen[bytes]

    def wait_for_progress(self, outcomes: int) -> None:
        """Until the run has `outcomes` outcomes, the processes alive meanwhile."""
        wait_for_progress(
            self.scenario.settings,
            self.run_id,
            outcomes,
            self.scenario.size.settle_s,
            self.procs.assert_alive,
        )

    def producer_finished(self, timeout_s: float) -> dict[str, Any]:
        """The producer's summary, once it has exited 0 within `timeout_s`."""
        assert self.producer.wait(timeout=timeout_s) == 0
        return self.procs.producer_summary(self.run_id)

    def ledger(self, settle_s: float | None = None) -> Ledger:
        """Where every URL of the site ended, once each has one outcome and the queues are
        drained (within `settle_s`, the size's by default)."""
        return wait_for_ledger(
            self.scenario.settings,
            self.run_id,
            self.web.urls(),
            self.scenario.size.settle_s if settle_s is None else settle_s,
            check=self.procs.assert_alive,
        )
