from __future__ import annotations

import dataclasses
import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from producer.dedup import Dedup, split_fingerprint
from producer.fetch import FetchFailed, HttpFetcher
from producer.patience import PUBLISH_ATTEMPTS
from producer.pipeline import Pipeline
from producer.publisher import ConfirmingPublisher
from producer.routing import load_router
from producer.service import Options, run
from producer.sitemaps import SitemapEntry
from shared.amqp import broker
from shared.amqp.broker import Publication
from shared.amqp.topology import build_topology, new_task_routing_key, work_exchange, work_queue
from shared.errors import ServiceUnavailable
from shared.messages import CrawlTask, Progress
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import fingerprint

REPO = Path(__file__).resolve().parents[2]
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


class LocalSite:
    """A tiny web server on 127.0.0.1 serving a dict of path -> body; anything else is a 404."""

    def __init__(self, pages: dict[str, bytes]) -> None:
        pages_ = pages
        self.user_agents: list[str] = []
        user_agents = self.user_agents

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                user_agents.append(self.headers.get("User-Agent", ""))
                body = pages_.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output quiet

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalSite:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def urlset(entries: list[str]) -> bytes:
    return f'<?xml version="1.0"?><urlset {NS}>{"".join(entries)}</urlset>'.encode()


@pytest.fixture
def site() -> Iterator[LocalSite]:
    pages: dict[str, bytes] = {}
    with LocalSite(pages) as served:
        root = served.root
        important = [f"<url><loc>{root}/top/{i}</loc><priority>0.9</priority></url>" for i in range(5)]
        news = [f"<url><loc>{root}/news/{i}</loc><priority>0.5</priority></url>" for i in range(7)]
        # /page/0 again, spelled differently; b.bin lists it too.
        repeat = [f"<url><loc>{root.upper()}/page/0#x</loc></url>"]
        pages["/robots.txt"] = f"User-agent: *\nSitemap: {root}/index.xml\n".encode()
        pages["/index.xml"] = (
            f"<sitemapindex {NS}>"
            f"<sitemap><loc>{root}/a.xml</loc></sitemap>"
            f"<sitemap><loc>{root}/b.bin</loc></sitemap>"
            f"<sitemap><loc>{root}/gone.xml</loc></sitemap>"
            "</sitemapindex>"
        ).encode()
        pages["/a.xml"] = urlset(important + news + repeat + ["<url><loc>ftp://x/y</loc></url>"])
        # gzip served under a name that does not say so: found by its magic bytes.
        pages["/b.bin"] = gzip.compress("\n".join(f"{root}/page/{i}" for i in range(20)).encode())
        yield served


def test_http_fetcher_caps_bodies_and_reports_errors_in_one_line(settings: Settings) -> None:
    small = dataclasses.replace(settings, max_sitemap_bytes=100_000)
    with (
        LocalSite({"/ok.xml": b"x" * 100_000, "/big.xml": b"x" * 100_001}) as served,
        HttpFetcher(small) as fetch,
    ):
        assert fetch(served.root + "/ok.xml") == b"x" * 100_000
        with pytest.raises(FetchFailed, match="larger than 100000 bytes"):
            fetch(served.root + "/big.xml")
        with pytest.raises(FetchFailed, match="HTTP 404") as missing:
            fetch(served.root + "/nothing.xml")
        assert missing.value.http_status == 404
        assert set(served.user_agents) == {settings.user_agent}
    with HttpFetcher(small) as fetch, pytest.raises(FetchFailed, match="connection failed"):
        fetch("http://127.0.0.1:1/sitemap.xml")


def depth(settings: Settings, kind: str) -> int:
    connection = broker.connect(settings, "test")
    try:
        return broker.queue_depth(connection.channel(), work_queue(settings.crawl_namespace, kind))[0]
    finally:
        connection.close()


def test_site_run_publishes_each_new_url_once(settings: Settings, site: LocalSite) -> None:
    result = run(settings, Options(run_id="it-1", sites=(site.root + "/",)))

    assert result["enqueued"] == {"priority": 5, "ttl": 7, "bulk": 20}
    assert result["enqueued_total"] == 32
    assert result["urls_seen"] == 5 + 7 + 1 + 1 + 20
    assert result["duplicates"] == 1
    assert result["invalid"] == {"invalid_url: scheme 'ftp' not http/https": 1}
    assert result["sitemaps_read"] == 3
    assert result["sitemaps_failed"] == [{"url": f"{site.root}/gone.xml", "error": "HTTP 404"}]
    assert result["publish_failed"] == 0
    assert [depth(settings, kind) for kind in ("priority", "ttl", "bulk")] == [5, 7, 20]

    client = connect_redis(settings, OPERATOR)
    try:
        stats = client.hgetall(Keys(settings.redis_prefix).run_stats("it-1"))
    finally:
        client.close()
    assert stats == {
        b"enqueued.priority": b"5",
        b"enqueued.ttl": b"7",
        b"enqueued.bulk": b"20",
        b"duplicates": b"1",
        b"invalid": b"1",
    }

    # The same run again: everything is a duplicate, nothing new is published.
    again = run(settings, Options(run_id="it-1", sites=(site.root + "/",)))
    assert again["enqueued_total"] == 0
    assert again["duplicates"] == 33
    assert [depth(settings, kind) for kind in ("priority", "ttl", "bulk")] == [5, 7, 20]


def producer_samples() -> dict[str, float]:
    """The producer's metrics now, every series of each summed."""
    wanted = ("crawl_producer_urls_enqueued", "crawl_producer_duplicates", "crawl_producer_invalid_urls")
    totals = dict.fromkeys(wanted, 0.0)
    for family in REGISTRY.collect():
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals


def test_the_producer_metrics_count_what_its_summary_reports(settings: Settings, site: LocalSite) -> None:
    before = producer_samples()

    result = run(settings, Options(run_id="it-metrics", sites=(site.root + "/",)))

    after = producer_samples()
    moved = {name: after[name] - before[name] for name in after}
    assert moved == {
        "crawl_producer_urls_enqueued": result["enqueued_total"],
        "crawl_producer_duplicates": result["duplicates"],
        "crawl_producer_invalid_urls": sum(result["invalid"].values()),
    }
    assert (result["enqueued_total"], result["duplicates"], sum(result["invalid"].values())) == (32, 1, 1)


def test_published_tasks_carry_body_headers_and_priority(settings: Settings, site: LocalSite) -> None:
    run(settings, Options(run_id="it-2", sitemaps=(site.root + "/a.xml",)))
    connection = broker.connect(settings, "test")
    try:
        channel = connection.channel()
        method, properties, body = channel.basic_get(work_queue(settings.crawl_namespace, "priority"))
        assert method is not None
        task = CrawlTask.decode(body)
        assert task.url.startswith(site.root + "/top/")
        assert (task.run_id, task.queue, task.priority, task.sitemap_priority) == ("it-2", "priority", 5, 0.9)
        assert task.source == site.root + "/a.xml"
        assert properties.priority == 5
        assert properties.delivery_mode == 2
        assert properties.headers is None  # no progress yet: a fresh URL
        assert Progress.from_headers(properties.headers) == Progress()
        channel.basic_nack(method.delivery_tag, requeue=True)
    finally:
        connection.close()


def test_url_file_input(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "seeds.txt"
    path.write_text("# seeds\nhttp://127.0.0.1:9/a\nhttp://127.0.0.1:9/live/b\nnot a url\n")
    result = run(settings, Options(run_id="it-3", url_files=(str(path),)))
    assert result["enqueued"] == {"priority": 0, "ttl": 1, "bulk": 1}
    assert result["invalid"] == {"invalid_url: contains whitespace or control characters": 1}


def test_unroutable_message_fails_and_publisher_recovers_from_a_closed_channel(
    settings: Settings,
) -> None:
    connection = broker.connect(settings, "test")
    broker.declare_topology(connection, build_topology(settings))
    connection.close()
    exchange = work_exchange(settings.crawl_namespace)
    good = Publication(exchange, new_task_routing_key("bulk"), b"{}")
    with ConfirmingPublisher(settings) as publisher:
        publisher.start()
        unroutable = Publication(exchange, "new.nowhere", b"{}")
        assert publisher.publish_batch([good, unroutable, good]) == [True, False, True]
        # A returned message carries no delivery tag: it is found by its content, alike or not.
        other = Publication(exchange, "new.elsewhere", b"{}")
        assert publisher.publish_batch([unroutable, good, unroutable, other]) == [False, True, False, False]
        # A missing exchange makes the broker close the channel; the next batch reconnects.
        missing = Publication(settings.crawl_namespace + ".no-such-exchange", "x", b"{}")
        assert publisher.publish_batch([missing]) == [False]
        assert publisher.publish_batch([good] * 1000) == [True] * 1000
    assert depth(settings, "bulk") == 1003


def test_publisher_against_a_closed_port_is_service_unavailable() -> None:
    settings = Settings(amqp_url="amqp://guest:guest@127.0.0.1:1/%2f")
    with pytest.raises(ServiceUnavailable, match="RabbitMQ"), ConfirmingPublisher(settings) as publisher:
        publisher.start()


def run_producer_process(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "producer", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help() -> None:
    done = run_producer_process("--help")
    assert done.returncode == 0
    assert "--sitemap" in done.stdout and "--run-id" in done.stdout


def test_unreachable_broker_is_one_line_on_stderr() -> None:
    done = run_producer_process(
        "--sitemap",
        "http://127.0.0.1:9/sitemap.xml",
        AMQP_URL="amqp://guest:guest@127.0.0.1:1/%2f",
        LOG_LEVEL="INFO",
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("producer: error: cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1")
    assert "Traceback" not in done.stderr


def test_no_inputs_is_a_usage_error() -> None:
    done = run_producer_process()
    assert done.returncode == 2
    assert "give at least one --sitemap, --site, --urls or --start" in done.stderr


def test_closed_publisher_leaves_no_thread_behind(settings: Settings) -> None:
    before = threading.active_count()
    with ConfirmingPublisher(settings) as publisher:
        publisher.start()
        assert threading.active_count() == before + 1
    assert threading.active_count() == before


class FlakyPublisher:
    """Confirms nothing whose body mentions a URL in `refuse`; records every attempt."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.attempts: list[int] = []

    def publish_batch(self, publications: Sequence[Publication]) -> list[bool]:
        self.attempts.append(len(publications))
        return [CrawlTask.decode(p.body).url not in self.refuse for p in publications]

    def submit(self, publications: Sequence[Publication]) -> Done:
        return Done(self.publish_batch(publications))


@dataclasses.dataclass
class Done:
    outcomes: list[bool]

    def wait(self) -> list[bool]:
        return self.outcomes


def test_failed_publishes_are_retried_then_unmarked(settings: Settings) -> None:
    client = connect_redis(settings, OPERATOR)
    keys = Keys(settings.redis_prefix)
    urls = [f"http://example.com/{i}" for i in range(10)]
    publisher = FlakyPublisher(refuse={urls[3], urls[7]})
    try:
        pipeline = Pipeline(
            "it-5",
            settings.crawl_namespace,
            4,
            load_router(""),
            Dedup(client, keys, "it-5"),
            publisher,
            sleep=lambda _s: None,
        )
        counts = pipeline.run(SitemapEntry(url, "seeds") for url in urls)
        assert counts.enqueued["bulk"] == 8
        assert counts.publish_failed == 2
        # Batches of 4, 4 and 2 go out together; then each refused URL is tried until its
        # attempts run out.
        assert publisher.attempts == [4, 4, 2] + [1] * 2 * (PUBLISH_ATTEMPTS - 1)

        def state(url: str) -> bytes | None:
            bucket, field = split_fingerprint(fingerprint(url))
            value = client.hget(keys.seen("it-5", bucket), field)
            return value if isinstance(value, bytes) else None

        # Confirmed URLs are marked; failed ones are un-marked, so a re-run publishes them.
        assert [state(url) for url in urls] == [b"c"] * 3 + [None] + [b"c"] * 3 + [None] + [b"c"] * 2
        assert client.hget(keys.run_stats("it-5"), "enqueued.bulk") == b"8"

        publisher.refuse.clear()
        again = Pipeline(
            "it-5", settings.crawl_namespace, 4, load_router(""), Dedup(client, keys, "it-5"), publisher
        ).run(SitemapEntry(url, "seeds") for url in urls)
        assert (again.enqueued["bulk"], again.duplicates, again.publish_failed) == (2, 8, 0)
    finally:
        client.close()
