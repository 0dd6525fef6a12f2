"""Submitting a run through the control queue: `python -m ops.submit` queues a checked request
(a bad one is one line, exit 2, nothing queued), and `python -m producer --serve` seeds it as
`python -m producer` would, acking it once the run is seeded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.submit import submit
from producer.seeding import seeded_summary
from shared.amqp import broker
from shared.amqp.topology import build_topology, control_queue, work_queue
from shared.crawl_request import CrawlRequest
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import recorded_enqueued
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.integration.test_producer import LocalSite, urlset

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PAGES = 12


@pytest.fixture
def site() -> Iterator[LocalSite]:
    pages: dict[str, bytes] = {}
    with LocalSite(pages) as served:
        pages["/sitemap.xml"] = urlset([f"<url><loc>{served.root}/p/{n}</loc></url>" for n in range(PAGES)])
        yield served


def ready(settings: Settings, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of a queue."""
    connection = broker.connect(settings, "test-submit")
    try:
        broker.declare_topology(connection, build_topology(settings))
        return broker.queue_depth(connection.channel(), queue)
    finally:
        connection.close()


def submit_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.submit", *args],
        cwd=REPO,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_queues_a_checked_request_and_refuses_bad_ones(settings: Settings) -> None:
    queue = control_queue(settings.crawl_namespace)
    done = submit_cli(settings, "--run-id", "sub-1", "--sitemap", "http://127.0.0.1:9/sitemap.xml")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["run_id"] == "sub-1" and answer["operation"].startswith("req-")
    for args, error in (
        ((), "no URL"),
        (("--url", "http://exa mple.com/"), "urls[0] 'http://exa mple.com/': contains whitespace"),
        (("--site", "http://10.0.0.7/"), "sites[0] 'http://10.0.0.7/': blocked address: 10.0.0.7 is private"),
        (("--run-id", "r" * 65, "--url", "http://127.0.0.1:9/"), "run_id: use up to 64 letters"),
        (("--json", "/nonexistent/request.json"), "--json /nonexistent/request.json: cannot read it"),
    ):
        refused = submit_cli(settings, *args)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith("submit: error: ") and error in refused.stderr
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert ready(settings, queue) == (1, 0), "a refused request was queued"

    connection = broker.connect(settings, "test-submit")
    try:
        method, _properties, body = connection.channel().basic_get(queue, auto_ack=True)
    finally:
        connection.close()
    assert method is not None
    request = CrawlRequest.decode(body)
    assert (request.run_id, request.sitemaps, request.request_id) == (
        "sub-1",
        ("http://127.0.0.1:9/sitemap.xml",),
        answer["operation"],
    )


def test_the_producer_service_seeds_a_submitted_run_then_acks_it(settings: Settings, site: LocalSite) -> None:
    env = service_env(settings)
    service = subprocess.Popen(
        [sys.executable, "-m", "producer", "--serve"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    queue = control_queue(settings.crawl_namespace)
    client = connect_redis(settings, OPERATOR)
    try:
        submitted = submit(settings, {"run_id": "served-1", "sitemaps": [f"{site.root}/sitemap.xml"]})
        again = submit(settings, {"run_id": "served-1", "sitemaps": [f"{site.root}/sitemap.xml"]})
        deadline = time.monotonic() + 60
        keys = Keys(settings.redis_prefix)
        while time.monotonic() < deadline:
            if seeded_summary(settings, "served-1") is not None and ready(settings, queue)[0] == 0:
                break
            assert service.poll() is None, service.stdout.read() if service.stdout else ""
            time.sleep(0.2)
        assert recorded_enqueued(client, keys, "served-1") == PAGES
        assert ready(settings, work_queue(settings.crawl_namespace, "bulk"))[0] == PAGES  # not twice
        summary = seeded_summary(settings, "served-1")
        assert summary is not None and summary["enqueued_total"] == PAGES
    finally:
        client.close()
        service.terminate()
        output, _ = service.communicate(timeout=30)
    assert service.returncode == 0, output
    assert f"crawl request {submitted.operation}: seeding run served-1" in output
    assert f"crawl request {again.operation}: run served-1 was seeded at" in output
    assert ready(settings, queue) == (0, 0), "a request was left in the control queue"
