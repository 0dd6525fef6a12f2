"""RabbitMQ restarted mid-run, while the producer is still publishing: the producer re-publishes
what was not confirmed, every worker and the dead-letter consumer reconnect and declare the
topology again, and nothing is lost. With classic queues; with quorum queues it is a known loss."""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import OUTAGE_TIMEOUT_S
from tests.faults.fleet import Fleet
from tests.faults.outages import rabbitmq_stopped
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape

pytestmark = pytest.mark.timeout(OUTAGE_TIMEOUT_S)

WORKERS = 4
DOWN_S = 3.0
RECONNECTED = "reconnected to RabbitMQ"


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_broker_restart_loses_nothing_and_everyone_reconnects(
    queue_type: str, services_to_ourselves: None, scenario: Scenario
) -> None:
    settings, size, report = scenario.settings, scenario.size, scenario.report
    crawl = scenario.crawling("broker", SiteShape.slow(size.urls), WORKERS, QUEUE_TYPE=queue_type)
    procs, producer = crawl.procs, crawl.producer
    crawl.wait_for_progress(size.urls // 20)
    assert producer.poll() is None, "the producer finished before the restart: nothing to test"

    with rabbitmq_stopped(settings):
        time.sleep(DOWN_S)
        restarting_at = time.monotonic()  # start_app follows at once
    broker_boot_s = time.monotonic() - restarting_at
    reconnect_s = wait_for_reconnects(procs, restarting_at, timeout_s=60)

    summary = crawl.producer_finished(size.settle_s)
    ledger = crawl.ledger()
    republished = procs.log_lines("producer", "publishes not confirmed")
    report(
        **ledger.figures(),
        down_s=DOWN_S,
        broker_boot_s=round(broker_boot_s, 1),
        reconnect_s_max=round(max(reconnect_s.values()), 1),
        reconnect_s=reconnect_s,
        producer_republish_rounds=len(republished),
        enqueued=summary["enqueued_total"],
        redeliveries=len(procs.log_lines("worker", "redelivered ")),
        tracebacks=len(procs.log_lines("", "Traceback")),
    )
    assert summary["enqueued_total"] == size.urls and summary["publish_failed"] == 0
    ledger.assert_every_url_once()
    assert len(ledger.stored) == size.urls
    assert set(reconnect_s) == {"dlq_consumer", *(f"worker-{i}" for i in range(1, WORKERS + 1))}
    # One line per reconnect, and no traceback storm.
    for name in reconnect_s:
        assert len(procs.log_lines(name, RECONNECTED)) == 1
    assert procs.log_lines("", "Traceback") == []


def wait_for_reconnects(procs: Fleet, since: float, timeout_s: float) -> dict[str, float]:
    """Seconds from `since` (the broker being started again) until each process logged its reconnect."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < len(procs.running) and time.monotonic() < deadline:
        for name in procs.running:
            if name not in seen and procs.log_lines(name, RECONNECTED):
                seen[name] = round(time.monotonic() - since, 2)
        time.sleep(0.1)
    return seen
