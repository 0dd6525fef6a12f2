"""A pool dedicated to the priority queue (`python -m worker --queues priority`) fetches the
priority queue's URLs and leaves the other queues to other workers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.site import LoggedSite, pages_route
from ops.accounting import account
from shared.amqp import broker
from shared.amqp.topology import build_topology, new_task_routing_key, work_exchange, work_queue
from shared.message_bounds import QUEUE_KINDS
from shared.messages import CrawlTask
from shared.settings import Settings
from tests.e2e.conftest import service_env

REPO = Path(__file__).resolve().parents[2]
RUN = "dedicated"


@pytest.mark.timeout(90)
def test_a_priority_pool_serves_the_priority_queue_only(settings: Settings) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "worker", "--queues", "priority"],
        cwd=REPO,
        env=service_env(settings, WORKER_ID="dedicated-1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    connection = broker.connect(settings, "test")
    try:
        broker.declare_topology(connection, build_topology(settings))
        channel = connection.channel()
        deadline = time.monotonic() + 60
        while broker.queue_depth(channel, work_queue(settings.crawl_namespace, "priority"))[1] == 0:
            assert worker.poll() is None, worker.communicate()[1]
            assert time.monotonic() < deadline, "the worker never consumed"
            time.sleep(0.2)
        consumers = {
            kind: broker.queue_depth(channel, work_queue(settings.crawl_namespace, kind))[1]
            for kind in QUEUE_KINDS
        }
        assert consumers == {"priority": 1, "ttl": 0, "bulk": 0}
        with LoggedSite(pages_route) as site:
            confirmed = broker.confirm_channel(connection)
            for kind in QUEUE_KINDS:
                task = CrawlTask(url=site.url(f"/{kind}"), run_id=RUN, queue=kind)
                publication = broker.Publication(
                    work_exchange(settings.crawl_namespace),
                    new_task_routing_key(kind),
                    task.encode(),
                    {},
                    None,
                )
                broker.publish(confirmed, publication)
            while account(settings, RUN).stored < 1:
                assert time.monotonic() < deadline, "the priority URL was never stored"
                time.sleep(0.2)
            time.sleep(1.0)  # time enough to take another, were it served
            paths = sorted(hit.path for hit in site.hits)
        ready = {
            kind: broker.queue_depth(channel, work_queue(settings.crawl_namespace, kind))[0]
            for kind in QUEUE_KINDS
        }
    finally:
        connection.close()
        worker.terminate()
        worker.communicate(timeout=60)
    assert account(settings, RUN).stored == 1
    assert paths == ["/priority", "/robots.txt"]
    assert ready == {"priority": 0, "ttl": 1, "bulk": 1}


def test_unknown_queue_kinds_are_refused_in_one_line(settings: Settings) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--queues", "priority,fast"],
        cwd=REPO,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "worker: error: --queues: expected some of priority,ttl,bulk, got 'priority,fast'\n"
