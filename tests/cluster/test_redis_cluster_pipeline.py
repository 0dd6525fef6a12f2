"""The whole pipeline (producer, workers, dead-letter consumer as processes) on the local Redis
Cluster: every URL accounted for exactly once, and the state spread over all three primaries.
Runs under `make faults-cluster` (marker `cluster`), after `make redis-cluster-up`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from tests.e2e.conftest import service_env
from tests.faults.fleet import Fleet
from tests.faults.ledger import wait_for_ledger
from tests.faults.site import FaultSite, SiteShape
from tests.faults_cluster.redis_nodes import cluster_settings, node_client, nodes, wait_healthy

pytestmark = pytest.mark.timeout(300)

URLS = 600
ALWAYS_500 = 10
WORKERS = 3


def test_a_crawl_on_a_redis_cluster_accounts_for_every_url_once(tmp_path: Path) -> None:
    wait_healthy()
    with (
        cluster_settings() as settings,
        FaultSite(SiteShape(pages=URLS, always_500=ALWAYS_500, urls_per_sitemap=100)) as web,
    ):
        env = service_env(
            settings, REDIS_URL=settings.redis_url, RATE_LIMIT_RPS="2000", MAX_CONCURRENT_PER_DOMAIN="32"
        )
        fleet = Fleet(tmp_path / "logs", env)
        try:
            fleet.start_services(WORKERS)
            producer = fleet.producer("cluster", "--sitemap", web.sitemap_index)
            assert producer.wait(timeout=120) == 0, (tmp_path / "logs" / "producer-cluster.log").read_text()
            ledger = wait_for_ledger(settings, "cluster", web.urls(), 150, check=fleet.assert_alive)
            summary = fleet.producer_summary("cluster")
            seen = _seen_keys_per_primary(settings.redis_prefix)
            client = connect_redis(settings, OPERATOR)
            stats: dict[Any, Any] = client.hgetall(Keys(settings.redis_prefix).run_stats("cluster"))
            client.close()
        finally:
            fleet.stop()
            fleet.close()
    assert summary["enqueued_total"] == URLS + ALWAYS_500 and summary["publish_failed"] == 0
    assert ledger.lost == [] and ledger.duplicated == []
    assert len(ledger.stored) == URLS and len(ledger.dead) == ALWAYS_500
    assert all(reason == "http_500" for reason in ledger.dead_by_reason()), ledger.dead_by_reason()
    enqueued = sum(int(v) for k, v in stats.items() if k.startswith(b"enqueued."))
    assert enqueued == URLS + ALWAYS_500, stats
    # The dedup hashes of the run live on every primary, not on one.
    assert len(seen) == 3 and min(seen.values()) > 0, seen
    assert fleet.log_lines("", "Traceback") == []


def _seen_keys_per_primary(prefix: str) -> dict[int, int]:
    return {
        node.port: sum(1 for _ in node_client(node.port).scan_iter(f"{prefix}:seen:*", count=1000))
        for node in nodes()
        if node.primary
    }
