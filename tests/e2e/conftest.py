"""End-to-end fixtures: the demo site in this process, the services as real processes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from demo_site.config import SiteConfig
from demo_site.server import DemoSite
from shared.settings import Settings


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
