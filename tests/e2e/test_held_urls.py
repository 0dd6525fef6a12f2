"""A worker process that holds its waiting URLs unacked, in-process, instead of bouncing them
through the defer queues: the domain's rate still holds, the broker sees each URL once, and a
worker killed while holding gives every held URL back."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from bench.site import LoggedSite, pages_route
from ops.accounting import account
from shared.amqp import broker
from shared.amqp.topology import work_queue
from shared.settings import Settings
from tests.e2e.conftest import metric_total, metric_value, service_env
from tests.pacing import most_over_pace
from tests.ports import free_port

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def site() -> Iterator[LoggedSite]:
    with LoggedSite(pages_route) as logged:
        yield logged


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "worker"], cwd=REPO, env=env, stdout=out, stderr=out)


def produce(env: dict[str, str], site: LoggedSite, run_id: str, pages: int, tmp_path: Path) -> None:
    urls = tmp_path / f"{run_id}.txt"
    urls.write_text("".join(f"{site.url(f'/p/{n}')}\n" for n in range(pages)), encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "producer", "--urls", str(urls), "--run-id", run_id],
        cwd=REPO,
        env=env,
        capture_output=True,
        check=True,
        timeout=120,
    )


def wait_for(condition: Callable[[], bool], worker: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not met(condition):
        assert worker.poll() is None, "the worker died"
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def met(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except requests.ConnectionError:
        return False  # the worker's metrics server is not listening yet: CI asked before it was


def ready_in(settings: Settings, queue: str) -> int:
    connection = broker.connect(settings, "test-held-depth")
    try:
        return broker.queue_depth(connection.channel(), queue)[0]
    finally:
        connection.close()


def test_held_urls_keep_the_rate_and_pass_through_the_broker_once(
    settings: Settings, site: LoggedSite, tmp_path: Path
) -> None:
    port = free_port()
    # 2 per second and a short inline wait: nearly every URL waits seconds for its slot.
    env = service_env(
        settings, RATE_LIMIT_RPS="2", MAX_INLINE_WAIT_S="0.2", FETCH_CONCURRENCY="4", LOG_LEVEL="WARNING"
    )
    worker = start_worker({**env, "METRICS_PORT": str(port)}, tmp_path / "worker.log")
    try:
        produce(env, site, "held", 16, tmp_path)
        wait_for(lambda: account(settings, "held").stored == 16, worker, 120)
        holds = metric_total(port, "crawl_holds_total")
        parked = metric_value(port, 'crawl_holds_total{reason="parked"}')
        deferrals = metric_total(port, "crawl_deferrals_total")
        deliveries = metric_total(port, "crawl_messages_consumed_total")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    pages = sorted(hit.at for hit in site.hits if hit.path.startswith("/p/"))
    assert len(pages) == 16
    # Not faster than 2/s over any stretch, a request's lateness on a loaded machine allowed
    # once (tests/pacing.py): at twice the rate the 17 requests would run 6 ahead of it.
    assert most_over_pace([hit.at for hit in site.hits], 2.0) <= 1
    # Each URL was delivered once and never sent back to the broker to wait.
    assert (deferrals, deliveries) == (0, 16)
    assert holds >= 8  # a prefetch of 8 at 2 per second: most of them waited in the worker
    # URLs 9 to 16 came one at a time as the first 8 were acked, behind seconds of slots held
    # for the rest of those 8: parked as they came, not handled until then.
    assert parked >= 1


def test_a_worker_killed_while_holding_urls_gives_every_one_back(
    settings: Settings, site: LoggedSite, tmp_path: Path
) -> None:
    port = free_port()
    # One request every 5 s: the worker takes its prefetch (4) and holds what it cannot send.
    env = service_env(
        settings, RATE_LIMIT_RPS="0.2", MAX_INLINE_WAIT_S="0.2", FETCH_CONCURRENCY="2", LOG_LEVEL="WARNING"
    )
    worker = start_worker({**env, "METRICS_PORT": str(port)}, tmp_path / "worker.log")
    queue = work_queue(settings.crawl_namespace, "bulk")
    try:
        produce(env, site, "killed", 10, tmp_path)
        wait_for(lambda: metric_total(port, "crawl_messages_held") >= 3, worker, 60)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)  # reaped here, not warned of in a later test
    # The broker gives back everything the dead worker held: every URL not stored is ready again.
    deadline = time.monotonic() + 30
    while ready_in(settings, queue) != 10 - account(settings, "killed").stored:
        assert time.monotonic() < deadline, "held URLs were not given back"
        time.sleep(0.2)
    assert account(settings, "killed").stored <= 2

    # And another worker crawls them.
    fast = start_worker(service_env(settings, LOG_LEVEL="WARNING"), tmp_path / "second.log")
    try:
        wait_for(lambda: account(settings, "killed").stored == 10, fast, 120)
    finally:
        fast.send_signal(signal.SIGTERM)
        fast.wait(timeout=60)
