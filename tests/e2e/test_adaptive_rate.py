"""The adaptive slow-down end to end: `ops.crawl` (producer, a pool of workers, the dead-letter
consumer) against a site that answers 429, without Retry-After, to any request beyond a rate it
keeps to itself. The crawl must settle below that rate, having been refused by it for less than
5% of its requests, and store every page."""

from __future__ import annotations

import pytest

from bench.secret_rate import SecretRate, crawl, figures
from ops.accounting import account
from shared.settings import Settings
from tests.e2e.conftest import service_env

SECRET_RPS = 20.0
CONFIGURED_RPS = 40.0  # what RATE_LIMIT_RPS allows: twice what the site takes
PAGES = 200


@pytest.mark.timeout(120)
def test_a_crawl_settles_below_a_secret_rate_and_is_rarely_refused(settings: Settings) -> None:
    route = SecretRate(SECRET_RPS)
    env = service_env(
        settings,
        RATE_LIMIT_RPS=str(CONFIGURED_RPS),
        RATE_RECOVERY_S="30",
        MAX_ATTEMPTS="5",
        # The run id ops.crawl makes is not known here: every run of this test's schema counts.
    )
    crawl(route, PAGES, env, workers=2, timeout_s=90)
    found = figures(route)
    print(f"\n{found.line()}")  # the figure, in the test's output with -s
    runs = {run for (run,) in _runs(settings)}
    assert len(runs) == 1
    assert account(settings, runs.pop()).stored == PAGES
    assert found.refused_share < 0.05, found.line()
    assert found.settled_rps < SECRET_RPS, found.line()
    assert found.settled_rps > SECRET_RPS / 4, found.line()  # slowed, not stalled


def _runs(settings: Settings) -> list[tuple[str]]:
    from shared.postgres import db

    with db.connect(settings) as conn:
        return [(str(run),) for (run,) in conn.execute("SELECT DISTINCT run_id FROM pages").fetchall()]
