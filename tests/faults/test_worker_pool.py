"""`python -m worker --processes N`: the forked workers share the work, a stop reaches them all,
and a worker that dies is forked again while the others go on, with nothing lost."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.postgres import db
from shared.settings import Settings
from tests.faults.conftest import SIZE, Size
from tests.faults.fleet import STOP_BOUND_S, Fleet
from tests.faults.ledger import wait_for_ledger, wait_for_progress
from tests.faults.site import FaultSite, SiteShape

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

PAGES = 300
POOL_ARGS = ("--processes", "2", "--concurrency", "4")


def pool_members(parent_pid: int) -> list[int]:
    children = Path(f"/proc/{parent_pid}/task/{parent_pid}/children").read_text().split()
    return sorted(int(pid) for pid in children)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def stored_by_worker(settings: Settings, run_id: str) -> dict[str, int]:
    with db.connect(settings, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT worker_id, count(*) FROM pages WHERE run_id = %s GROUP BY worker_id", (run_id,)
        ).fetchall()
    stored: dict[str, int] = {}
    for worker_id, count in rows:
        assert isinstance(worker_id, str) and isinstance(count, int)
        stored[worker_id] = count
    return stored


def start_pool(procs: Fleet) -> tuple[subprocess.Popen[bytes], list[int]]:
    """The dead-letter consumer and a pool of two workers; the pool and its workers' pids."""
    procs.start("dlq_consumer", "dlq_consumer", "consume")
    pool = procs.start("worker-pool", "worker", *POOL_ARGS)
    wait_until(lambda: len(pool_members(pool.pid)) == 2)
    return pool, pool_members(pool.pid)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_pool_shares_the_crawl_and_stops_as_one(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
) -> None:
    web = site(SiteShape(pages=PAGES, page_delay_s=0.01))
    procs = fleet(env(WORKER_ID="pool"))
    _pool, members = start_pool(procs)
    assert procs.producer("pool", "--sitemap", web.sitemap_index).wait(timeout=60) == 0

    ledger = wait_for_ledger(settings, "pool", web.urls(), size.settle_s, check=procs.assert_alive)
    ledger.assert_every_url_once()
    assert len(ledger.stored) == PAGES
    by_worker = stored_by_worker(settings, "pool")
    assert set(by_worker) == {"pool-0", "pool-1"}, by_worker  # each forked worker has its own id
    assert all(count > 0 for count in by_worker.values())

    exits = procs.stop()
    assert exits["worker-pool"].code == 0
    assert exits["worker-pool"].seconds < STOP_BOUND_S
    assert all(gone(pid) for pid in members)  # the stop reached every worker


def test_a_worker_that_dies_is_started_again_and_loses_nothing(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
) -> None:
    web = site(SiteShape(pages=PAGES, page_delay_s=0.05))
    procs = fleet(env(WORKER_ID="doomed"))
    pool, (survivor_pid, victim_pid) = start_pool(procs)
    producer = procs.producer("doomed", "--sitemap", web.sitemap_index)
    wait_for_progress(settings, "doomed", PAGES // 4, size.settle_s, procs.assert_alive)

    os.kill(victim_pid, signal.SIGKILL)
    # The pool forks a new worker in the dead one's place; the survivor never stopped.
    wait_until(lambda: len(pool_members(pool.pid)) == 2 and victim_pid not in pool_members(pool.pid))
    assert pool.poll() is None
    assert survivor_pid in pool_members(pool.pid)

    assert producer.wait(timeout=60) == 0
    ledger = wait_for_ledger(settings, "doomed", web.urls(), size.settle_s, check=procs.assert_alive)
    ledger.assert_every_url_once()
    assert len(ledger.stored) == PAGES
    assert set(ledger.stored.values()) == {0}  # the crash was charged to no URL
    assert set(stored_by_worker(settings, "doomed")) == {"doomed-0", "doomed-1"}  # same ids again
    exits = procs.stop()
    assert exits["worker-pool"].code == 0
