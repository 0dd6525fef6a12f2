"""A crawl held back by its rate limit: the waits and deferrals show in their own metrics, and
the retry counter keeps counting failures only."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo_site.server import DemoSite
from ops.crawl import Processes
from shared.settings import Settings
from tests.e2e.conftest import metric_total, produce, service_env, wait_until_accounted
from tests.ports import free_port

pytestmark = pytest.mark.timeout(240)

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
        expected = produce(settings, demo_site, "e2e-defer", **POLITE)
        a = wait_until_accounted(settings, "e2e-defer", expected, procs.check_alive)

        assert a.accounted == expected
        assert metric_total(port, "crawl_rate_limit_waits_total") > 0
        assert metric_total(port, "crawl_rate_limit_wait_seconds_total") > 0
        assert metric_total(port, "crawl_deferrals_total") > 0
        # The demo's fail-twice and always-500 pages are the only failures.
        assert metric_total(port, "crawl_retries_total") == a.retries
    finally:
        procs.stop_all()
