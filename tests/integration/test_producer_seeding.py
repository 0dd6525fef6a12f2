"""`python -m producer` as a container runs it: its exit codes when sitemaps fail, and `--once`,
which seeds a run the first time and does nothing when the container is started again."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from shared.amqp import broker
from shared.amqp.topology import work_queue
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from tests.integration.test_producer import LocalSite, urlset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sitemaps() -> Iterator[LocalSite]:
    """/ok.xml lists 4 pages; /gone.xml and /also-gone.xml are 404s."""
    pages: dict[str, bytes] = {}
    with LocalSite(pages) as served:
        pages["/ok.xml"] = urlset([f"<url><loc>{served.root}/page/{i}</loc></url>" for i in range(4)])
        yield served


def producer_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "AMQP_URL": settings.amqp_url,
        "REDIS_URL": settings.redis_url,
        "CRAWL_NAMESPACE": settings.crawl_namespace,
        "REDIS_PREFIX": settings.redis_prefix,
        "FETCH_ALLOWLIST": settings.fetch_allowlist,
        # The same retry queues as the test's settings, which its teardown deletes: the default
        # ones the producer would declare otherwise were left in the broker.
        "RETRY_DELAYS_S": ",".join(str(d) for d in settings.retry_delays_s),
        "METRICS_PORT": "0",
    }


def producer(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "producer", *args],
        cwd=REPO,
        env=producer_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def summary(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def queued(settings: Settings) -> int:
    connection = broker.connect(settings, "test")
    try:
        channel = connection.channel()
        return sum(
            broker.queue_depth(channel, work_queue(settings.crawl_namespace, kind))[0]
            for kind in ("priority", "ttl", "bulk")
        )
    finally:
        connection.close()


def test_every_sitemap_failing_exits_3(settings: Settings, sitemaps: LocalSite) -> None:
    done = producer(
        settings, "--sitemap", sitemaps.root + "/gone.xml", "--sitemap", sitemaps.root + "/also-gone.xml"
    )
    assert done.returncode == 3, done.stderr
    result = summary(done)
    assert result["urls_seen"] == 0
    assert len(result["sitemaps_failed"]) == 2  # type: ignore[arg-type]
    assert "no sitemap could be read" in done.stderr


def test_some_sitemaps_failing_exits_0_and_names_them(settings: Settings, sitemaps: LocalSite) -> None:
    root = sitemaps.root
    done = producer(settings, "--sitemap", root + "/ok.xml", "--sitemap", root + "/gone.xml")
    assert done.returncode == 0, done.stderr
    result = summary(done)
    assert result["enqueued_total"] == 4
    assert result["sitemaps_failed"] == [{"url": sitemaps.root + "/gone.xml", "error": "HTTP 404"}]
    assert "1 sitemaps could not be read" in done.stderr


def test_once_seeds_a_run_only_the_first_time(settings: Settings, sitemaps: LocalSite) -> None:
    args = ("--sitemap", sitemaps.root + "/ok.xml", "--run-id", "seed-1", "--once")
    first = producer(settings, *args)
    assert first.returncode == 0, first.stderr
    assert summary(first)["enqueued_total"] == 4
    fetches = len(sitemaps.user_agents)

    again = producer(settings, *args)

    assert again.returncode == 0, again.stderr
    repeated = summary(again)
    assert repeated["already_seeded"] is True
    assert repeated["run_id"] == "seed-1"
    assert repeated["enqueued_total"] == 4  # the first seeding's figures
    assert len(sitemaps.user_agents) == fetches, "the sitemap was read again"
    assert queued(settings) == 4
    client = connect_redis(settings, OPERATOR)
    try:
        stats = client.hgetall(Keys(settings.redis_prefix).run_stats("seed-1"))
    finally:
        client.close()
    assert int(stats.get(b"duplicates", 0)) == 0, "the second start counted duplicates"


def test_once_tries_again_after_a_failed_seeding(settings: Settings, sitemaps: LocalSite) -> None:
    args = ("--sitemap", sitemaps.root + "/late.xml", "--run-id", "seed-2", "--once")
    assert producer(settings, *args).returncode == 3

    # The sitemap appears: the next start reads it, since the failed one left no mark.
    with LocalSite({"/late.xml": urlset([f"<url><loc>{sitemaps.root}/p</loc></url>"])}) as late:
        retried = producer(settings, "--sitemap", late.root + "/late.xml", "--run-id", "seed-2", "--once")
    assert retried.returncode == 0, retried.stderr
    assert summary(retried)["enqueued_total"] == 1
    assert "already_seeded" not in summary(retried)


def test_once_with_a_sitemap_failed_is_not_marked_seeded(settings: Settings, sitemaps: LocalSite) -> None:
    root = sitemaps.root
    args = ("--sitemap", root + "/ok.xml", "--sitemap", root + "/gone.xml", "--run-id", "seed-3", "--once")
    first = producer(settings, *args)
    assert first.returncode == 0, first.stderr  # without --strict: what could be read is crawled
    assert summary(first)["enqueued_total"] == 4

    # The next start reads both again (the 404 may be gone), publishing nothing twice.
    again = producer(settings, *args)
    assert again.returncode == 0, again.stderr
    repeated = summary(again)
    assert "already_seeded" not in repeated
    assert repeated["enqueued_total"] == 0 and repeated["duplicates"] == 4
    assert queued(settings) == 4
    # With --strict, as compose runs it, the failure is an exit code a restart policy sees.
    assert producer(settings, *args, "--strict").returncode == 3


def test_once_needs_a_run_id(settings: Settings, sitemaps: LocalSite) -> None:
    done = producer(settings, "--sitemap", sitemaps.root + "/ok.xml", "--once")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "producer: error: --once: give the run a name with --run-id, or every start is a new run"
    ]


def test_a_failed_run_keeps_its_exit_code_through_the_final_scrape(
    settings: Settings, sitemaps: LocalSite
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**producer_env(settings), "METRICS_PORT": str(port), "METRICS_LINGER_S": "60"}
    args = ["--sitemap", sitemaps.root + "/gone.xml"]
    process = subprocess.Popen(
        [sys.executable, "-m", "producer", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert json.loads(process.stdout.readline())["urls_seen"] == 0  # the run is over
        served = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert served.status_code == 200
        assert "crawl_producer_duplicates_total" in served.text
        assert process.wait(timeout=10) == 3  # the final figures were read: it exits, with 3
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
