"""The metrics a crawl's processes serve agree with what PostgreSQL holds, and every metric
declared in shared/metrics.py moves in a real crawl."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from bench.site import Answer, Hit, LoggedSite, page
from demo_site.server import DemoSite
from ops.accounting import account
from ops.crawl import Processes
from shared import metrics
from shared.amqp import broker
from shared.amqp.broker import Publication
from shared.amqp.topology import new_task_routing_key, work_exchange
from shared.messages import CrawlTask
from shared.postgres import db
from shared.settings import Settings
from tests.e2e.conftest import metric_total, produce, service_env, wait_until_accounted
from tests.ports import free_port

pytestmark = pytest.mark.timeout(240)


def test_scraped_counters_equal_the_stored_and_dead_letter_counts(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    worker_port, dlq_port = free_port(), free_port()
    procs = Processes(tmp_path, service_env(settings))
    procs.env = {**procs.env, "METRICS_PORT": str(dlq_port)}
    procs.start("dlq_consumer", "dlq_consumer")
    procs.env = {**procs.env, "METRICS_PORT": str(worker_port)}
    procs.start("worker", "worker")
    try:
        expected = produce(settings, demo_site, "e2e-metrics")
        a = wait_until_accounted(settings, "e2e-metrics", expected, procs.check_alive)
        assert metric_total(worker_port, "crawl_pages_stored_total") == a.stored
        assert metric_total(dlq_port, "crawl_dead_letters_total") == a.dead
        assert metric_total(worker_port, "crawl_retries_total") == a.retries
    finally:
        procs.stop_all()


# Declared metrics a real crawl may leave at zero, each with its reason. Keep it short: the
# crawl below is built to move every metric, and an entry that moves anyway fails the test,
# so that it is taken off the list.
# Held URLs and deferrals exclude each other at this site's small waits, and this crawl runs with
# MAX_HOLD_S=0 so that deferrals move; tests/e2e/test_held_urls.py scrapes both of these.
EXCUSED: dict[str, str] = {
    "crawl_holds": "MAX_HOLD_S=0 here; moved in tests/e2e/test_held_urls.py",
    "crawl_messages_held": "MAX_HOLD_S=0 here; moved in tests/e2e/test_held_urls.py",
    "crawl_proxy_failures": "no proxy here; moved in tests/integration/test_socks_proxy.py",
    "crawl_proxy_usable": "no proxy here; moved in tests/integration/test_socks_proxy.py",
    # The renderer's: this crawl has no browser and RENDER is off (tests/renderer, which need
    # chromium, run the renderer: make test-renderer).
    "crawl_renders": "no renderer here",
    "crawl_render_requests_refused": "no renderer here",
    "crawl_browser_rss_bytes": "no renderer here",
    "crawl_sent_to_render": "RENDER is off here",
}
ETAG = '"v1"'
SLOW_PAGE_S = 0.3  # long enough for a scrape to find fetches in flight


def declared_families() -> set[str]:
    """Every metric family shared/metrics.py declares: a new one is covered without a change here."""
    return {
        family.name
        for value in vars(metrics).values()
        if isinstance(value, MetricWrapperBase)
        for family in value.describe()
    }


_FLAKY_FAILED = threading.Event()  # /flaky has failed its once


def moving_site_route(hit: Hit) -> Answer:
    """A site whose crawl moves every metric: pages with ETags (304s on revalidation), a page
    that fails once (a retry), one that is gone (a dead letter), one robots.txt forbids (a skip)."""
    path = hit.path
    if path == "/robots.txt":
        robots = f"User-agent: *\nDisallow: /private/\nSitemap: http://{hit.domain}/sitemap.xml\n"
        return Answer(200, robots.encode(), {"Content-Type": "text/plain"})
    if path == "/sitemap.xml":
        paths = [f"/ok/{n}" for n in range(6)] + ["/flaky", "/gone", "/private/page"]
        locs = [f"http://{hit.domain}{p}" for p in paths]
        locs += [
            f"http://{hit.domain.upper()}/ok/0#again",
            "ftp://files.example/nothing",
        ]  # duplicate, invalid
        body = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
        urlset = f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{body}</urlset>'
        return Answer(200, urlset.encode(), {"Content-Type": "application/xml"})
    if path == "/gone":
        return Answer(410, b"gone")
    if path == "/flaky" and not _FLAKY_FAILED.is_set():
        _FLAKY_FAILED.set()
        return Answer(500, b"try again")
    if path.startswith(("/ok/", "/flaky", "/private/")):
        if hit.headers.get("If-None-Match") == ETAG:
            return Answer(304, b"", {"ETag": ETAG})
        time.sleep(SLOW_PAGE_S)
        answer = page(path)
        return Answer(answer.status, answer.body, {**answer.headers, "ETag": ETAG})
    return Answer(404, b"not found")


class Service:
    """One service as a child process, its output in a log file (stdout piped, if asked: the
    producer's summary)."""

    def __init__(
        self, module: str, env: dict[str, str], log_dir: Path, *args: str, pipe_stdout: bool = False
    ) -> None:
        self.log = log_dir / f"{module}-{len(list(log_dir.iterdir()))}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                env=env,
                stdout=subprocess.PIPE if pipe_stdout else out,
                stderr=out,
            )

    def check_alive(self) -> None:
        assert self.process.poll() is None, f"exited with {self.process.returncode}: {self.log.read_text()}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class Scrapes:
    """The largest sample of each metric family seen in any scrape of any process."""

    def __init__(self) -> None:
        self.largest: dict[str, float] = {}

    def scrape(self, port: int) -> None:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not sample.name.endswith("_created"):  # a timestamp, not a count
                    self.largest[family.name] = max(self.largest.get(family.name, 0.0), sample.value)

    def moved(self) -> set[str]:
        return {name for name, value in self.largest.items() if value > 0}


def produce_and_scrape(env: dict[str, str], tmp_path: Path, run_id: str, root: str, scrapes: Scrapes) -> int:
    """Run the producer with a metrics port, read its summary, scrape it once, and check that
    this one scrape is what lets it exit. Returns the number of URLs it enqueued."""
    port = free_port()
    producer = Service(
        "producer",
        {**env, "METRICS_PORT": str(port), "METRICS_LINGER_S": "60"},
        tmp_path,
        "--run-id",
        run_id,
        "--site",
        root,
        pipe_stdout=True,
    )
    try:
        assert producer.process.stdout is not None
        line = producer.process.stdout.readline()  # printed before it lingers
        summary = json.loads(line)
        assert producer.process.poll() is None, "the producer exited before its figures were read"
        scrapes.scrape(port)
        assert producer.process.wait(timeout=30) == 0
    finally:
        producer.stop()
    assert (summary["duplicates"], sum(summary["invalid"].values())) == (1, 1)
    enqueued: int = summary["enqueued_total"]
    return enqueued


def send_second_copy(settings: Settings, run_id: str) -> None:
    """Publish a task for a page the run has stored already, without headers: a second copy."""
    with db.connect(settings) as conn:
        row = conn.execute("SELECT url FROM pages WHERE run_id = %s LIMIT 1", (run_id,)).fetchone()
    assert row is not None, f"run {run_id} stored no page"
    task = CrawlTask(url=str(row[0]), run_id=run_id, queue="bulk")
    connection = broker.connect(settings, "second-copy")
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        routing = new_task_routing_key("bulk")
        broker.publish(channel, Publication(work_exchange(settings.crawl_namespace), routing, task.encode()))
    finally:
        connection.close()


def crawl_until_accounted(
    settings: Settings, run_id: str, expected: int, services: list[tuple[Service, int]], scrapes: Scrapes
) -> None:
    """Wait for the run to be accounted for, scraping every process all along (a gauge such as
    fetches in flight is only non-zero while the crawl goes on)."""
    deadline = time.monotonic() + 90
    while account(settings, run_id).accounted < expected:
        assert time.monotonic() < deadline, f"run {run_id} did not finish"
        for service, port in services:
            service.check_alive()
            scrapes.scrape(port)
        time.sleep(0.1)
    for _service, port in services:
        scrapes.scrape(port)


def test_every_declared_metric_moves_in_a_crawl(settings: Settings, tmp_path: Path) -> None:
    """Three runs of one small site: a first crawl (retries, a dead letter, a robots.txt skip,
    rate-limit deferrals, a duplicate and an invalid URL at the producer), a second that
    revalidates every page (304s), and a third by a worker that trusts its cache (cache hits).
    Every process is scraped; each family of shared/metrics.py must have a non-zero sample."""
    _FLAKY_FAILED.clear()
    env = service_env(
        settings,
        RATE_LIMIT_RPS="4",
        # Waits up to 0.3 s are slept in-process (rate-limit waits); longer ones go back through
        # the broker (deferrals), not held in the worker. At 4 per second (0.2625 s apart with
        # the limiter's headroom) both happen: the worker's threads learn robots.txt's rules
        # together and ask for their slots at once, so the second waits one interval and the
        # rest longer.
        MAX_INLINE_WAIT_S="0.3",
        MAX_HOLD_S="0",
        CACHE_ENABLED="true",
        MAX_ATTEMPTS="3",
    )
    scrapes = Scrapes()
    dlq_port = free_port()
    dlq = Service("dlq_consumer", {**env, "METRICS_PORT": str(dlq_port)}, tmp_path)
    revalidating_port = free_port()
    revalidating = Service(
        "worker", {**env, "METRICS_PORT": str(revalidating_port), "CACHE_FRESH_S": "0"}, tmp_path
    )
    trusting: Service | None = None
    try:
        with LoggedSite(moving_site_route) as site:
            root = site.url("/")
            for run_id in ("moving-1", "moving-2"):
                expected = produce_and_scrape(env, tmp_path, run_id, root, scrapes)
                crawl_until_accounted(
                    settings, run_id, expected, [(dlq, dlq_port), (revalidating, revalidating_port)], scrapes
                )
            revalidating.stop()
            trusting_port = free_port()
            trusting = Service(
                "worker", {**env, "METRICS_PORT": str(trusting_port), "CACHE_FRESH_S": "3600"}, tmp_path
            )
            expected = produce_and_scrape(env, tmp_path, "moving-3", root, scrapes)
            crawl_until_accounted(
                settings, "moving-3", expected, [(dlq, dlq_port), (trusting, trusting_port)], scrapes
            )
            send_second_copy(settings, "moving-3")  # as a producer killed before its mark would
            deadline = time.monotonic() + 30
            while "crawl_duplicate_deliveries" not in scrapes.moved() and time.monotonic() < deadline:
                scrapes.scrape(trusting_port)
                time.sleep(0.1)
    finally:
        for service in (dlq, revalidating, trusting):
            if service is not None:
                service.stop()

    declared = declared_families()
    assert set(EXCUSED) <= declared, "an excused metric is not declared in shared/metrics.py"
    never_moved = declared - scrapes.moved() - set(EXCUSED)
    assert not never_moved, f"declared but never moved in the crawl: {sorted(never_moved)}"
    moved_anyway = set(EXCUSED) & scrapes.moved()
    assert not moved_anyway, f"these move now: take {sorted(moved_anyway)} off EXCUSED"
