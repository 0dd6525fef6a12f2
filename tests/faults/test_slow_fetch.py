"""Fetches far slower than the heartbeat interval never cost a worker its broker connection: the
connection's thread keeps heartbeats flowing while handler threads wait on the network."""

from __future__ import annotations

import pytest

from tests.faults.conftest import SIZE
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

HEARTBEAT_S = 1  # the broker drops a connection after two silent intervals
SLOW_ANSWER_S = 6.0


def test_slow_fetches_keep_the_connection(scenario: Scenario) -> None:
    # Every /hang/ page answers after SLOW_ANSWER_S: each worker thread waits that long.
    shape = SiteShape(pages=20, hangs=8, hang_s=SLOW_ANSWER_S)
    slow = {"HEARTBEAT_S": str(HEARTBEAT_S), "FETCH_READ_TIMEOUT_S": "30", "FETCH_DEADLINE_S": "30"}
    crawl = scenario.crawled("slow", shape, 1, 60, **slow)
    web, procs, report = crawl.web, crawl.procs, scenario.report

    ledger = crawl.ledger(60)
    lost_connections = procs.log_lines("", "lost RabbitMQ")
    report(**ledger.figures(), heartbeat_s=HEARTBEAT_S, slow_answer_s=SLOW_ANSWER_S)
    ledger.assert_every_url_once()
    assert len(ledger.stored) == 28
    assert lost_connections == []
    assert web.hits("/hang/1.html") == 1  # fetched once: no timeout, no redelivery
