"""Two of the cluster's three nodes lost mid-crawl, on quorum queues: first the node leading the
work queue, then a second one, then both brought back. While two are down the quorum queues have
no majority and cannot take or give messages: the producer waits for its confirms, the consumers
wait to reconnect, and once a majority is back the crawl resumes. Every URL ends stored or dead
exactly once; the figures are each consumer's reconnect times and the producer's confirm waits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from shared.amqp.topology import work_queue
from shared.settings import Settings
from tests.faults.conftest import Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import wait_for_ledger, wait_for_progress
from tests.faults.site import FaultSite, SiteShape
from tests.faults_cluster.cluster import NODES, node_number, queue_copies, start_node, stop_node

pytestmark = pytest.mark.timeout(900)

WORKERS = 3
ONE_DOWN_S = 3.0  # the leader alone is down: the queues elect another and go on
TWO_DOWN_S = 5.0  # no majority: the quorum queues stand still
LOST = "lost RabbitMQ"
RECONNECTED = "reconnected to RabbitMQ"


def test_losing_two_of_three_nodes_mid_crawl_loses_and_duplicates_nothing(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    # Slow sitemaps: the producer is still publishing through the outage; slow pages: the
    # workers are in the middle of their messages. Plain pages all go to the bulk queue.
    web = site(
        SiteShape(pages=size.urls, urls_per_sitemap=size.urls // 20, sitemap_delay_s=4.0, page_delay_s=0.05)
    )
    procs = fleet(env(LOG_FORMAT="json"))
    procs.start_services(WORKERS)
    started = time.monotonic()
    producer = procs.producer("cluster", "--sitemap", web.sitemap_index)
    wait_for_progress(settings, "cluster", size.urls // 10, size.settle_s, procs.assert_alive)
    assert producer.poll() is None, "the producer finished before the outage: nothing to test"

    bulk = work_queue(settings.crawl_namespace, "bulk")
    first = node_number(queue_copies()[bulk].leader)
    began = time.monotonic()
    stop_node(first)
    first_stop_s = time.monotonic() - began
    time.sleep(ONE_DOWN_S)
    survivors = [n for n in NODES if n != first]
    # The second to go is the bulk queue's new leader, if one was elected: the harder case.
    new_leader = queue_copies(survivors[0])[bulk].leader
    second = node_number(new_leader) if new_leader else survivors[0]
    last = next(n for n in survivors if n != second)
    stopping_second_at = time.monotonic()
    stop_node(second)
    two_down_at = time.monotonic()
    time.sleep(TWO_DOWN_S)
    restarting_at = time.monotonic()
    both_back(first, second)
    back_at = time.monotonic()
    assert queue_copies(last)[bulk].leader, "no leader after both nodes came back"

    assert producer.wait(timeout=size.settle_s + 180) == 0, "the producer failed; see its log"
    summary = procs.producer_summary("cluster")
    ledger = wait_for_ledger(settings, "cluster", web.urls(), size.settle_s, check=procs.assert_alive)
    reconnects = reconnect_times(procs.log_dir)
    report(
        **ledger.figures(),
        stopped=[f"crawl{first}", f"crawl{second}"],
        stop_s=[round(first_stop_s, 1), round(two_down_at - stopping_second_at, 1)],
        one_down_s=round(two_down_at - began, 1),
        two_down_s=round(restarting_at - two_down_at, 1),
        restart_s=round(back_at - restarting_at, 1),
        reconnect_s=reconnects,
        reconnect_s_max=max((max(t) for t in reconnects.values() if t), default=0.0),
        producer_unconfirmed=summary["unconfirmed"],
        producer_confirm_wait_max_s=summary["confirm_wait_max_s"],
        producer_republish_rounds=len(procs.log_lines("producer", "publishes not confirmed")),
        enqueued=summary["enqueued_total"],
        publish_failed=summary["publish_failed"],
        redeliveries=len(procs.log_lines("worker", "redelivered ")),
        producer_elapsed_s=summary["elapsed_s"],
        outage_from_start_s=round(began - started, 1),
    )
    assert summary["enqueued_total"] == size.urls and summary["publish_failed"] == 0
    assert ledger.lost == [], f"{len(ledger.lost)} lost, e.g. {ledger.lost[:5]}"
    assert ledger.duplicated == [], ledger.duplicated[:5]
    assert len(ledger.stored) + len(ledger.dead) == size.urls
    # Each consumer whose connection broke came back; none is still waiting.
    for name, times in reconnects.items():
        assert all(t >= 0 for t in times), name
    assert procs.log_lines("", "Traceback") == []


def both_back(*nodes: int) -> None:
    """Start the nodes at once: each waits for the others' tables, so one at a time is slower."""
    errors: list[BaseException] = []

    def start(n: int) -> None:
        try:
            start_node(n)
        except BaseException as exc:  # reported on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(n,)) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def reconnect_times(log_dir: Path) -> dict[str, list[float]]:
    """Per consumer, the seconds from each lost connection (its first 'lost' line) to the
    'reconnected' line that ended it; -1 for one still lost at the end. From the JSON logs."""
    found: dict[str, list[float]] = {}
    for path in sorted(log_dir.glob("*.log")):
        if path.name.startswith("producer"):
            continue
        lost_at: datetime | None = None
        times: list[float] = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = str(entry.get("message", ""))
            at = datetime.fromisoformat(entry["ts"])
            if LOST in message and lost_at is None:
                lost_at = at
            elif RECONNECTED in message and lost_at is not None:
                times.append(round((at - lost_at).total_seconds(), 2))
                lost_at = None
        if lost_at is not None:
            times.append(-1.0)
        found[path.stem] = times
    return found
