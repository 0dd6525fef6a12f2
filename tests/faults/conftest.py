"""Fixtures of the fault scenarios: their size, the local site, the services as processes, and
the figures each scenario reports.

FAULTS_SIZE=small (the default of `make faults`) keeps each scenario within about a minute;
FAULTS_SIZE=large (`make faults FAULTS_SIZE=large`) runs the sizes docs/RELIABILITY.md reports.
`make test` and a bare `pytest` never run them (pyproject.toml).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.faults.fleet import Fleet
from tests.faults.outages import wait_until_alone
from tests.faults.scenario import Scenario
from tests.faults.site import FaultSite, SiteShape

REPO = Path(__file__).resolve().parents[2]
FIGURES_DIR = REPO / "var" / "faults"


@dataclass(frozen=True)
class Size:
    name: str
    crash_urls: int  # URLs of the worker-crash scenario
    urls: int  # URLs of the other scenarios
    postgres_outage_s: float
    settle_s: float  # how long a scenario may take to account for every URL
    timeout_s: int  # per test, not counting a wait for other test runs to finish


SIZES = {
    "small": Size("small", crash_urls=1_500, urls=1_000, postgres_outage_s=8, settle_s=90, timeout_s=240),
    "large": Size("large", crash_urls=10_000, urls=5_000, postgres_outage_s=20, settle_s=420, timeout_s=900),
}
SIZE = SIZES[os.environ.get("FAULTS_SIZE", "small")]
# A test that restarts a service may first wait this long for other test runs to finish.
OUTAGE_TIMEOUT_S = SIZE.timeout_s + 600

# Fast enough that the site, not politeness, sets the pace: one domain serves every URL here.
FAULT_ENV = {
    "RATE_LIMIT_RPS": "5000",
    "MAX_CONCURRENT_PER_DOMAIN": "64",
    "PUBLISH_BATCH_SIZE": "100",
    "LOG_LEVEL": "INFO",
}


@pytest.fixture
def size() -> Size:
    return SIZE


@pytest.fixture
def services_to_ourselves() -> None:
    """For a scenario that restarts a service: first wait until no other test run uses them, so
    the outage strikes this scenario mid-run and nobody else's."""
    wait_until_alone()


@pytest.fixture
def env(settings: Settings) -> Callable[..., dict[str, str]]:
    """The child processes' environment for this test's names, plus any overrides."""

    def make(**overrides: str) -> dict[str, str]:
        return service_env(settings, **{**FAULT_ENV, **overrides})

    return make


@pytest.fixture
def site() -> Iterator[Callable[[SiteShape], FaultSite]]:
    started: list[FaultSite] = []

    def start(shape: SiteShape) -> FaultSite:
        started.append(FaultSite(shape).start())
        return started[-1]

    yield start
    for each in started:
        each.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Fleet]]:
    made: list[Fleet] = []

    def make(environment: dict[str, str]) -> Fleet:
        made.append(Fleet(tmp_path / f"logs-{len(made) + 1}", environment))
        return made[-1]

    yield make
    for each in made:
        each.close()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Record a scenario's figures: one JSON line in var/faults/figures-<size>.jsonl."""

    def record(**figures: object) -> None:
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        line = {"scenario": request.node.name, "size": SIZE.name, "at": time.strftime("%F %T"), **figures}
        with (FIGURES_DIR / f"figures-{SIZE.name}.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")
        request.config.stash.setdefault(_FIGURES, []).append(line)

    return record


@pytest.fixture
def scenario(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> Scenario:
    """The fixtures above, together, with the steps every scenario takes (tests/faults/scenario.py)."""
    return Scenario(settings, size, env, site, fleet, report)


_FIGURES = pytest.StashKey[list[dict[str, object]]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_FIGURES, [])
    if lines:
        terminalreporter.section(f"fault scenarios ({SIZE.name})")
        for line in lines:
            terminalreporter.write_line(json.dumps(line))
