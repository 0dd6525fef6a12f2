"""The metrics a crawl's processes serve agree with what PostgreSQL holds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from demo_site.server import DemoSite
from shared.accounting import account
from shared.crawl import Processes
from shared.settings import Settings
from tests.e2e.conftest import service_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metric_total(port: int, name: str) -> float:
    """Sum of every series of one metric, as Prometheus would scrape it."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )


def test_scraped_counters_equal_the_stored_and_dead_letter_counts(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    worker_port, dlq_port = free_port(), free_port()
    procs = Processes(tmp_path, service_env(settings))
    procs.env = {**procs.env, "METRICS_PORT": str(dlq_port)}
    procs.start("dlq_consumer", "dlq_consumer")
    procs.env = {**procs.env, "METRICS_PORT": str(worker_port)}
    procs.start("worker", "worker")
    try:
        producer = subprocess.run(
            [
                sys.executable,
                "-m",
                "producer",
                "--run-id",
                "e2e-metrics",
                "--sitemap",
                demo_site.config.sitemap_index_url,
            ],
            env=service_env(settings),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        expected = json.loads(producer.stdout)["enqueued_total"]
        deadline = time.monotonic() + 180
        while (a := account(settings, "e2e-metrics")).accounted < expected:
            assert time.monotonic() < deadline, "crawl did not finish"
            procs.check_alive()
            time.sleep(0.25)
        assert metric_total(worker_port, "crawl_pages_stored_total") == a.stored
        assert metric_total(dlq_port, "crawl_dead_letters_total") == a.dead
        assert metric_total(worker_port, "crawl_retries_total") == a.retries
    finally:
        procs.stop_all()
