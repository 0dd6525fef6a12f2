"""Runs as an operator handles them, with the services as processes: pause, resume, cancel, an
interrupted crawl finished under the same run id, and a worker killed mid-crawl coming back."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from bench.measure import children_of
from demo_site.server import DemoSite
from ops.accounting import account
from ops.crawl import Processes, run_crawl
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.redis.runstate import held_exchange, held_queue
from shared.settings import Settings
from tests.e2e.conftest import produce, service_env
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def held(settings: Settings) -> Iterator[None]:
    """Removes the hold queues and exchange the test's runs leave behind."""
    yield
    connection = broker.connect(settings, "test cleanup")
    channel = connection.channel()
    for run_id in ("e2e-pause", "e2e-cancel-held", "e2e-cancel-queued"):
        channel.queue_delete(held_queue(settings.crawl_namespace, run_id))
    channel.exchange_delete(held_exchange(settings.crawl_namespace))
    connection.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in {timeout_s} s"
        time.sleep(0.2)


def runs(settings: Settings, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ops.runs", *args],
        env=service_env(settings),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def depths(settings: Settings, *queues: str) -> dict[str, int]:
    connection = broker.connect(settings, "test depths")
    try:
        channel = connection.channel()
        return {queue: broker.queue_depth(channel, queue)[0] for queue in queues}
    finally:
        connection.close()


def metric(port: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )


def page_requests(site: DemoSite) -> int:
    return sum(1 for record in site.records() if record.method == "GET" and "sitemap" not in record.path)


def test_a_paused_run_waits_in_its_hold_queue_once_and_resume_finishes_it(
    settings: Settings, demo_site: DemoSite, tmp_path: Path, held: None
) -> None:
    topology = build_topology(settings)
    work, delay = topology.work_queues(), [q.name for q in topology.queues if ".retry." in q.name]
    total = produce(settings, demo_site, "e2e-pause")
    requests_before = page_requests(demo_site)
    assert "paused" in runs(settings, "pause", "e2e-pause")

    port = free_port()
    procs = Processes(tmp_path, service_env(settings))
    procs.start("dlq_consumer", "dlq_consumer")
    procs.env = service_env(settings, METRICS_PORT=str(port))
    procs.start("worker", "worker")
    hold = held_queue(settings.crawl_namespace, "e2e-pause")
    try:
        wait_until(lambda: depths(settings, hold)[hold] == total, "every message held")
        time.sleep(3)  # long enough for a loop through the broker to show
        assert depths(settings, hold, *work, *delay) == {hold: total, **dict.fromkeys([*work, *delay], 0)}
        # Each message was delivered to the worker once, and moved once: nothing bounced.
        assert metric(port, "crawl_messages_consumed_total") == total
        assert metric(port, "crawl_rate_limit_deferrals_total") == 0
        assert metric(port, "crawl_retries_total") == 0
        assert page_requests(demo_site) == requests_before  # nothing fetched
        assert account(settings, "e2e-pause").accounted == 0
        assert "paused" in runs(settings, "show", "e2e-pause")

        assert f"{total} held messages back" in runs(settings, "resume", "e2e-pause")
        wait_until(lambda: account(settings, "e2e-pause").accounted == total, "the resumed run finishing")
        procs.check_alive()
    finally:
        codes = procs.stop_all()
    assert set(codes.values()) == {0}
    expected = demo_site.config.expected()
    a = account(settings, "e2e-pause")
    assert a.stored == len(expected.normal) + len(expected.flaky)
    assert a.skipped == 0
    assert depths(settings, *work) == dict.fromkeys(work, 0)


def test_cancel_ends_held_and_queued_urls_as_skips_with_reason_cancelled(
    settings: Settings, demo_site: DemoSite, tmp_path: Path, held: None
) -> None:
    procs = Processes(tmp_path, service_env(settings))
    # One run's messages held, then the worker stopped; another run's left in the work queues.
    held_total = produce(settings, demo_site, "e2e-cancel-held")
    runs(settings, "pause", "e2e-cancel-held")
    procs.start("worker", "worker")
    hold = held_queue(settings.crawl_namespace, "e2e-cancel-held")
    wait_until(lambda: depths(settings, hold)[hold] == held_total, "every message held")
    assert set(procs.stop_all().values()) == {0}
    queued_total = produce(settings, demo_site, "e2e-cancel-queued")

    assert f"{held_total} held URLs recorded as skips" in runs(settings, "cancel", "e2e-cancel-held")
    assert "0 held URLs" in runs(settings, "cancel", "e2e-cancel-queued")
    procs = Processes(tmp_path, service_env(settings))
    procs.start("worker", "worker")
    try:
        wait_until(
            lambda: account(settings, "e2e-cancel-queued").accounted == queued_total, "queued URLs skipped"
        )
    finally:
        codes = procs.stop_all()
    assert set(codes.values()) == {0}
    for run_id, total in (("e2e-cancel-held", held_total), ("e2e-cancel-queued", queued_total)):
        a = account(settings, run_id)
        assert (a.stored, a.dead, a.skips_by_reason) == (0, 0, {"cancelled": total}), run_id
    assert depths(settings, *build_topology(settings).work_queues()) == dict.fromkeys(
        build_topology(settings).work_queues(), 0
    )
    assert "cancelled" in runs(settings, "show", "e2e-cancel-held")


def crawl_in_background(
    settings: Settings, site: DemoSite, run_id: str, log_dir: Path, workers: int, **env: str
) -> tuple[threading.Thread, dict[str, object], io.StringIO]:
    out = io.StringIO()
    result: dict[str, object] = {}

    def crawl() -> None:
        result["code"] = run_crawl(
            settings,
            ["--sitemap", site.config.sitemap_index_url],
            workers,
            run_id,
            service_env(settings, **env),
            log_dir,
            240,
            out,
            progress_every_s=1,
        )

    thread = threading.Thread(target=crawl, daemon=True)
    thread.start()
    return thread, result, out


def test_an_interrupted_crawl_is_finished_by_a_crawl_with_the_same_run_id(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    # The first try: everything published, a slow worker stopped after a few pages.
    total = produce(settings, demo_site, "e2e-resume")
    procs = Processes(tmp_path, service_env(settings, RATE_LIMIT_RPS="1"))
    procs.start("worker", "worker")
    try:
        wait_until(lambda: account(settings, "e2e-resume").stored >= 3, "a few pages stored")
    finally:
        codes = procs.stop_all()
    assert set(codes.values()) == {0}
    assert account(settings, "e2e-resume").accounted < total

    out = io.StringIO()
    code = run_crawl(
        settings,
        ["--sitemap", demo_site.config.sitemap_index_url],
        2,
        "e2e-resume",
        service_env(settings),
        tmp_path / "again",
        240,
        out,
    )
    output = out.getvalue()
    assert code == 0, output
    assert f"accounted for     {total:6d} of {total}: ok" in output
    assert ", 0 of them this time" in output  # its producer published nothing new
    a = account(settings, "e2e-resume")
    assert a.accounted == total == demo_site.config.expected().unique_total


def worker_pids(parent: int | None = None) -> list[int]:
    """The children of `parent` (default: this process) that are workers: the pool's parent of
    a crawl, or a pool's workers, forked from it."""
    pids = []
    for pid in children_of(parent or os.getpid()):
        with contextlib.suppress(OSError):  # a child that ended meanwhile is no worker now
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"worker"]:
                pids.append(pid)
    return pids


def test_a_worker_killed_during_a_crawl_is_started_again_and_the_crawl_completes(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    """A pool of one runs its worker in its own process: killed, the crawl starts it again."""
    thread, result, out = crawl_in_background(
        settings, demo_site, "e2e-restart", tmp_path, workers=1, RATE_LIMIT_RPS="3"
    )
    wait_until(lambda: account(settings, "e2e-restart").stored >= 3, "a few pages stored")
    (victim,) = worker_pids()
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=240)
    output = out.getvalue()
    assert result.get("code") == 0, output
    assert "worker-pool was killed by signal 9" in output
    assert "worker-pool started again" in output
    assert worker_pids() == []
    a = account(settings, "e2e-restart")
    assert a.accounted == demo_site.config.expected().unique_total
    assert "accounted for" in output and ": ok" in output


def test_a_pool_worker_killed_during_a_crawl_is_forked_again_by_its_pool(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    """The default layout: the pool replaces its worker, and the crawl sees no death at all."""
    thread, result, out = crawl_in_background(
        settings, demo_site, "e2e-pool-restart", tmp_path, workers=2, RATE_LIMIT_RPS="3"
    )
    wait_until(lambda: account(settings, "e2e-pool-restart").stored >= 3, "a few pages stored")
    (pool,) = worker_pids()
    wait_until(lambda: len(worker_pids(pool)) == 2, "both workers of the pool forked")
    victim = worker_pids(pool)[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(worker_pids(pool)) == 2 and victim not in worker_pids(pool), "a worker forked again"
    )
    thread.join(timeout=240)
    output = out.getvalue()
    assert result.get("code") == 0, output
    assert "was killed" not in output and "started again" not in output  # the pool's own business
    pool_log = (tmp_path / "worker-pool.log").read_text()
    assert f"(pid {victim}) ended with code 137" in pool_log  # 128 + SIGKILL
    assert "started again" in pool_log
    assert worker_pids() == []
    a = account(settings, "e2e-pool-restart")
    assert a.accounted == demo_site.config.expected().unique_total
    assert "accounted for" in output and ": ok" in output


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_a_crawl_and_prints_what_it_did_so_far(
    settings: Settings, demo_site: DemoSite, tmp_path: Path, stop: str
) -> None:
    run_id = f"e2e-{stop}"
    crawl = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ops.crawl",
            "--sitemap",
            demo_site.config.sitemap_index_url,
            "--workers",
            "2",
            "--run-id",
            run_id,
            "--log-dir",
            str(tmp_path),
        ],
        env=service_env(settings, RATE_LIMIT_RPS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )
    try:
        wait_until(lambda: account(settings, run_id).stored >= 2, "a few pages stored")
        if stop == "ctrl-c":
            os.killpg(crawl.pid, signal.SIGINT)  # what Ctrl-C on a terminal does
        else:
            crawl.send_signal(signal.SIGTERM)  # to the crawl alone, as `docker stop` or `kill` does
        output, _ = crawl.communicate(timeout=60)
    finally:
        if crawl.poll() is None:
            os.killpg(crawl.pid, signal.SIGKILL)
    assert crawl.returncode == {"ctrl-c": 130, "sigterm": 143}[stop], output
    said = {"ctrl-c": "interrupted", "sigterm": "terminated (SIGTERM)"}[stop]
    assert f"{said}: stopping the processes" in output
    a = account(settings, run_id)
    total = demo_site.config.expected().unique_total
    assert f"accounted for     {a.accounted:6d} of {total}: not finished" in output
    assert f"Finish the run with: make crawl RUN_ID={run_id}" in output
    # Every process stopped cleanly: workers on their own signal, the producer with its summary
    # (130 or 143: stopped before the end of its inputs, 0: it had read them all).
    codes = output.split("processes stopped with exit codes: ")[1].splitlines()[0]
    assert set(codes.replace(",", " ").split()) <= {
        "dlq_consumer=0",
        "worker-pool=0",
        "producer=0",
        "producer=130",
        "producer=143",
    }, codes
    assert "Traceback" not in output
