"""A Redis Cluster primary killed (SIGKILL) mid-crawl; its replica takes over.

The primary killed is the one holding the test site's rate-limit keys, and it also holds about a
third of the run's dedup hashes. Asserted: no URL lost, none stored or dead-lettered twice, every
URL enqueued once. Measured and reported (var/faults/figures-cluster.jsonl): how long the slots
were down, how far the replica lagged when the primary died, extra fetches, the one-second
windows in which the site saw more requests than the rate limit allows (from its own access
log), and the dedup marks the failover lost. Runs under `make faults-cluster`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from producer.dedup import split_fingerprint
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.urls import canonicalize, domain_of, fingerprint
from tests.e2e.conftest import service_env
from tests.faults.fleet import Fleet
from tests.faults.ledger import wait_for_ledger, wait_for_progress
from tests.faults.site import FaultSite, SiteShape
from tests.faults_cluster.redis_nodes import (
    Node,
    cluster_settings,
    node_client,
    nodes,
    primary_of,
    replica_of,
    wait_healthy,
)

pytestmark = pytest.mark.timeout(420)

URLS = int(os.environ.get("CLUSTER_FAULT_URLS", "1200"))
RATE_RPS = 40  # per domain: the site's access log shows whether a failover lets more through
WORKERS = 3
FIGURES = Path(__file__).resolve().parents[2] / "var" / "faults" / "figures-cluster.jsonl"


class LoggedSite(FaultSite):
    """The fault site, keeping an access log of its own: when each page was asked for."""

    def __init__(self, shape: SiteShape) -> None:
        super().__init__(shape)
        self.access_log: list[float] = []

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if not path.endswith(".xml") and path != "/robots.txt":
            self.access_log.append(time.monotonic())  # list.append is atomic under the GIL
        return super().answer(path)


def windows_over(times: list[float], rate_rps: float, window_s: float = 1.0) -> tuple[int, int]:
    """(Windows of `window_s` starting at a request that hold more requests than the limit lets
    through: rate × window plus the one that may go at once, the most requests in one window)."""
    times = sorted(times)
    allowed = int(rate_rps * window_s) + 1
    over, most, end = 0, 0, 0
    for start, at in enumerate(times):
        while end < len(times) and times[end] < at + window_s:
            end += 1
        most = max(most, end - start)
        over += end - start > allowed
    return over, most


def test_a_primary_killed_mid_crawl_loses_and_doubles_nothing(tmp_path: Path) -> None:
    wait_healthy()
    shape = SiteShape(pages=URLS, urls_per_sitemap=URLS // 20, sitemap_delay_s=1.0, page_delay_s=0.02)
    with cluster_settings() as settings, LoggedSite(shape) as web:
        keys = Keys(settings.redis_prefix)
        domain = domain_of(web.url("/pages/1.html"))
        victim = primary_of(keys.rate(domain))
        heir = replica_of(victim)
        env = service_env(
            settings,
            REDIS_URL=settings.redis_url,
            RATE_LIMIT_RPS=str(RATE_RPS),
            MAX_CONCURRENT_PER_DOMAIN="16",
            PUBLISH_BATCH_SIZE="50",
        )
        fleet = Fleet(tmp_path / "logs", env)
        try:
            fleet.start_services(WORKERS)
            producer = fleet.producer("failover", "--sitemap", web.sitemap_index)
            wait_for_progress(settings, "failover", URLS // 8, 120, fleet.assert_alive)
            assert producer.poll() is None, "the producer finished before the kill: nothing to test"
            lag_bytes = _replication_lag_bytes(victim, heir)
            killed_at = time.monotonic()
            os.kill(_pid_of(victim), signal.SIGKILL)
            down_s = _wait_promoted(heir)
            wait_healthy(60, members=5)
            assert producer.wait(timeout=240) == 0
            ledger = wait_for_ledger(settings, "failover", web.urls(), 240, check=fleet.assert_alive)
            summary = fleet.producer_summary("failover")
            client = connect_redis(settings, OPERATOR)
            try:
                unmarked = _not_marked_handled(client, keys, "failover", web.urls())
            finally:
                client.close()
            worker_pauses = len(fleet.log_lines("worker", "cannot reach Redis"))
            producer_waits = len(fleet.log_lines("producer", "Redis"))
            tracebacks = fleet.log_lines("", "Traceback")
        finally:
            fleet.stop()
            fleet.close()
            _restart_as_replica(victim)
    hits = web.page_hits()
    extra_fetches = sum(n - 1 for n in hits.values() if n > 1)
    around = [t for t in web.access_log if killed_at - 5 <= t <= killed_at + down_s + 10]
    over, most = windows_over(around, RATE_RPS)
    over_all, most_all = windows_over(web.access_log, RATE_RPS)
    figures = {
        "urls": URLS,
        "rate_rps": RATE_RPS,
        "killed_port": victim.port,
        "replica_port": heir.port,
        "replication_lag_bytes_at_kill": lag_bytes,
        "slots_down_s": round(down_s, 2),
        "lost": len(ledger.lost),
        "duplicated": len(ledger.duplicated),
        "stored": len(ledger.stored),
        "dead": len(ledger.dead),
        "rewrites": ledger.rewrites,
        "extra_fetches": extra_fetches,
        "enqueued": summary["enqueued_total"],
        "taken_over": summary.get("taken_over", 0),
        "windows_over_limit_near_failover": over,
        "most_in_1s_near_failover": most,
        "windows_over_limit_whole_run": over_all,
        "most_in_1s_whole_run": most_all,
        "dedup_marks_not_handled_at_end": unmarked,
        "worker_pause_lines": worker_pauses,
        "producer_redis_lines": producer_waits,
        "tracebacks": len(tracebacks),
    }
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with FIGURES.open("a") as out:
        out.write(json.dumps({"at": time.strftime("%F %T"), **figures}) + "\n")
    print(json.dumps(figures))
    assert ledger.lost == [], f"{len(ledger.lost)} lost, e.g. {ledger.lost[:5]}"
    assert ledger.duplicated == []
    assert len(ledger.stored) == URLS
    assert summary["enqueued_total"] == URLS and summary["publish_failed"] == 0
    assert tracebacks == []


def _pid_of(node: Node) -> int:
    info = node_client(node.port).info("server")
    return int(info["process_id"])


def _replication_lag_bytes(primary: Node, replica: Node) -> int:
    """How far the replica's applied replication offset trailed the primary's, read one after
    the other just before the kill: writes in that gap are what the promotion may forget."""
    sent = int(node_client(primary.port).info("replication")["master_repl_offset"])
    applied = int(node_client(replica.port).info("replication")["slave_repl_offset"])
    return max(0, sent - applied)


def _wait_promoted(heir: Node, timeout_s: float = 30.0) -> float:
    """Seconds until the replica calls itself a primary."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if node_client(heir.port).info("replication").get("role") == "master":
                return time.monotonic() - started
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"replica {heir.port} not promoted in {timeout_s} s")


def _not_marked_handled(client: redis.Redis, keys: Keys, run_id: str, urls: list[str]) -> int:
    """URLs settled by the run whose dedup field is not 'h' at the end: handled marks (or the
    confirm marks before them) the failover took with it."""
    missing = 0
    for url in urls:
        bucket, field = split_fingerprint(fingerprint(canonicalize(url)))
        if client.hget(keys.seen(run_id, bucket), field) != b"h":
            missing += 1
    return missing


def _restart_as_replica(node: Node) -> None:
    """Bring the killed node back (from its own dir): it rejoins as a replica of its heir, so
    the cluster is three primaries and three replicas again for whatever runs next."""
    if any(n.port == node.port for n in nodes()):
        return
    directory = Path(os.environ.get("REDIS_CLUSTER_DIR", Path.cwd() / "var" / "redis-cluster")) / str(
        node.port
    )
    script = Path(__file__).resolve().parents[2] / "deploy" / "local" / "redis-cluster.sh"
    os.spawnlp(os.P_WAIT, "bash", "bash", str(script), "up")  # starts the missing node only
    assert directory.exists()
