"""A crawl held back by its rate limit: the waits and deferrals show in their own metrics, and
the retry counter keeps counting failures only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from demo_site.server import DemoSite
from shared.accounting import account
from shared.crawl import Processes
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.e2e.test_metrics import free_port, metric_total

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# Slow enough per domain that URLs wait in-process and, past the short inline wait, are deferred
# (MAX_HOLD_S=0: not held in the worker, which tests/e2e/test_held_urls.py covers).
POLITE = {"RATE_LIMIT_RPS": "4", "MAX_INLINE_WAIT_S": "0.3", "MAX_HOLD_S": "0", "FETCH_CONCURRENCY": "8"}


def test_rate_limit_waits_and_deferrals_move_and_are_not_retries(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    port = free_port()
    env = service_env(settings, **POLITE)
    procs = Processes(tmp_path, {**env, "METRICS_PORT": str(port)})
    procs.start("worker", "worker")
    procs.env = env
    procs.start("dlq_consumer", "dlq_consumer")
    try:
        producer = subprocess.run(
            [
                sys.executable,
                "-m",
                "producer",
                "--run-id",
                "e2e-defer",
                "--sitemap",
                demo_site.config.sitemap_index_url,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        expected = json.loads(producer.stdout)["enqueued_total"]
        deadline = time.monotonic() + 180
        while (a := account(settings, "e2e-defer")).accounted < expected:
            assert time.monotonic() < deadline, "crawl did not finish"
            procs.check_alive()
            time.sleep(0.25)

        assert a.accounted == expected
        assert metric_total(port, "crawl_rate_limit_waits_total") > 0
        assert metric_total(port, "crawl_rate_limit_wait_seconds_total") > 0
        assert metric_total(port, "crawl_deferrals_total") > 0
        # The demo's fail-twice and always-500 pages are the only failures.
        assert metric_total(port, "crawl_retries_total") == a.retries
    finally:
        procs.stop_all()
