"""Fetches far slower than the heartbeat interval never cost a worker its broker connection: the
connection's thread keeps heartbeats flowing while handler threads wait on the network."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.settings import Settings
from tests.faults.conftest import SIZE
from tests.faults.fleet import Fleet
from tests.faults.ledger import wait_for_ledger
from tests.faults.site import FaultSite, SiteShape

pytestmark = [pytest.mark.faults, pytest.mark.timeout(SIZE.timeout_s)]

HEARTBEAT_S = 1  # the broker drops a connection after two silent intervals
SLOW_ANSWER_S = 6.0


def test_slow_fetches_keep_the_connection(
    settings: Settings,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    # Every /hang/ page answers after SLOW_ANSWER_S: each worker thread waits that long.
    web = site(SiteShape(pages=20, hangs=8, hang_s=SLOW_ANSWER_S))
    procs = fleet(env(HEARTBEAT_S=str(HEARTBEAT_S), FETCH_READ_TIMEOUT_S="30", FETCH_DEADLINE_S="30"))
    procs.start_services(1)
    assert procs.producer("slow", "--sitemap", web.sitemap_index).wait(timeout=60) == 0

    ledger = wait_for_ledger(settings, "slow", web.urls(), 60, check=procs.assert_alive)
    lost_connections = procs.log_lines("", "lost RabbitMQ")
    report(**ledger.figures(), heartbeat_s=HEARTBEAT_S, slow_answer_s=SLOW_ANSWER_S)
    ledger.assert_every_url_once()
    assert len(ledger.stored) == 28
    assert lost_connections == []
    assert web.hits("/hang/1.html") == 1  # fetched once: no timeout, no redelivery
