"""End-to-end fixtures: the demo site in this process, the services as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from demo_site.config import SiteConfig
from demo_site.server import DemoSite
from ops.accounting import Accounting, account
from shared.postgres import db
from shared.settings import Settings


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The unique settings, with their schema already made: a test counts outcomes from the
    moment its services start, which may be before any worker has made the tables."""
    db.ensure_schema(settings)
    return settings


@pytest.fixture
def demo_site() -> Iterator[DemoSite]:
    with DemoSite(SiteConfig(port=0, pages_per_host=12)) as site:
        yield site


def service_env(settings: Settings, **overrides: str) -> dict[str, str]:
    """The environment that points child processes at this test's queues, keys and schema."""
    return {
        **os.environ,
        "CRAWL_NAMESPACE": settings.crawl_namespace,
        "REDIS_PREFIX": settings.redis_prefix,
        "PG_SCHEMA": settings.pg_schema,
        "DATABASE_URL": settings.database_url,
        "RETRY_DELAYS_S": ",".join(str(d) for d in settings.retry_delays_s),
        "TTL_QUEUE_EXPIRY_S": str(settings.ttl_queue_expiry_s),
        "RATE_LIMIT_RPS": "50",
        "LOG_LEVEL": "INFO",
        "FETCH_ALLOWLIST": "127.0.0.0/8",  # the demo site is on loopback, which the guard refuses
        **overrides,
    }


def produce(settings: Settings, site: DemoSite, run_id: str, **env: str) -> int:
    """Run the producer over the demo site's sitemaps to the end; the URLs it enqueued."""
    result = subprocess.run(
        [sys.executable, "-m", "producer", "--run-id", run_id, "--sitemap", site.config.sitemap_index_url],
        env=service_env(settings, **env),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return int(json.loads(result.stdout)["enqueued_total"])


def wait_until_accounted(
    settings: Settings, run_id: str, expected: int, check_alive: Callable[[], None], timeout_s: float = 180
) -> Accounting:
    """Wait until `expected` URLs of the run have an outcome, checking the services stay up."""
    deadline = time.monotonic() + timeout_s
    while (accounting := account(settings, run_id)).accounted < expected:
        assert time.monotonic() < deadline, f"run {run_id} did not finish in {timeout_s} s"
        check_alive()
        time.sleep(0.25)
    return accounting


def metric_value(port: int, series: str) -> float:
    """One series' value, e.g. 'crawl_holds_total{reason="parked"}'; 0 when it is not there."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{series} ")]
    return values[0] if values else 0.0


def metric_total(port: int, name: str) -> float:
    """Sum of every series of one metric, as Prometheus would scrape it."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )
