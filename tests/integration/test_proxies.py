"""Proxies: a tiny forward proxy on 127.0.0.1 in front of a local site, and the shared bench."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import logging
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

from bench.site import Answer, Hit, LoggedSite, Route, pages_route
from producer.service import Options, run
from shared.errors import ConfigError, TransientError
from shared.http.proxies import Proxy, ProxyPool, RedisBench, parse_proxies
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.try_later import TryLater
from tests.integration.test_politeness import crawl_in_threads, rows
from tests.ports import closed_port

PASSWORD = "s3cret-pw"
FORWARDED_HEADERS = ("Content-Type", "ETag", "Last-Modified", "Retry-After", "Location")


class ForwardProxy(ThreadingHTTPServer):
    """Handles absolute-URI GETs by forwarding them to a loopback site; nothing else."""

    daemon_threads = True

    def __init__(self, credentials: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.credentials = credentials
        self.seen: list[str] = []  # absolute URIs asked for
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.server_address[1]}"

    def label(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _ProxyHandler(BaseHTTPRequestHandler):
    server: ForwardProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        target = urlsplit(self.path)
        if self.server.credentials is not None:
            expected = "Basic " + base64.b64encode(self.server.credentials.encode()).decode()
            if self.headers.get("Proxy-Authorization") != expected:
                self._answer(407, {"Proxy-Authenticate": "Basic"}, b"")
                return
        if target.hostname is None or not target.hostname.startswith("127."):
            self._answer(403, {}, b"loopback only")
            return
        with self.server.lock:
            self.server.seen.append(self.path)
        upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=5)
        try:
            upstream.request("GET", target.path or "/", headers={"User-Agent": self.headers["User-Agent"]})
            response = upstream.getresponse()
            body = response.read()
            headers = {k: v for k in FORWARDED_HEADERS if (v := response.getheader(k)) is not None}
            self._answer(response.status, headers, body)
        finally:
            upstream.close()

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def polite(settings: Settings) -> Iterator[Settings]:
    db.ensure_schema(settings)
    yield dataclasses.replace(settings, rate_limit_rps=50.0, proxy_max_failures=2, proxy_bench_s=30.0)


@pytest.fixture
def proxies() -> Iterator[list[ForwardProxy]]:
    made: list[ForwardProxy] = []
    yield made
    for proxy in made:
        proxy.close()


@pytest.mark.timeout(60)
def test_pages_go_through_the_proxy_and_record_it_without_credentials(
    polite: Settings, proxies: list[ForwardProxy], caplog: pytest.LogCaptureFixture
) -> None:
    proxy = ForwardProxy(credentials=f"crawler:{PASSWORD}")
    proxies.append(proxy)
    settings = dataclasses.replace(polite, proxies=proxy.url(f"crawler:{PASSWORD}@"))
    caplog.set_level(logging.DEBUG)
    with LoggedSite(pages_route) as site:
        report = crawl_in_threads(settings, [site.url("/a"), site.url("/b")], threads=2, run_s=20)
        site_paths = sorted(hit.path for hit in site.hits)
    assert sorted(report.done) == [site.url("/a"), site.url("/b")]
    assert sorted(proxy.seen) == sorted([site.url("/robots.txt"), site.url("/a"), site.url("/b")])
    assert site_paths == ["/a", "/b", "/robots.txt"]
    assert rows(settings, "SELECT DISTINCT proxy FROM pages") == [(proxy.label(),)]
    assert PASSWORD not in caplog.text
    assert PASSWORD not in repr(settings)


@pytest.mark.timeout(60)
def test_round_robin_shares_the_requests_between_proxies(
    polite: Settings, proxies: list[ForwardProxy]
) -> None:
    proxies.extend([ForwardProxy(), ForwardProxy()])
    settings = dataclasses.replace(polite, proxies=",".join(p.url() for p in proxies))
    with LoggedSite(pages_route) as site:
        crawl_in_threads(settings, [site.url(f"/p/{n}") for n in range(9)], threads=1, run_s=20)
    assert sorted(len(p.seen) for p in proxies) == [5, 5]  # 9 pages and robots.txt, in turn


@pytest.mark.timeout(60)
def test_a_failing_proxy_is_benched_for_every_worker_and_urls_still_arrive(
    polite: Settings, proxies: list[ForwardProxy], caplog: pytest.LogCaptureFixture
) -> None:
    live = ForwardProxy()
    proxies.append(live)
    dead = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}"
    settings = dataclasses.replace(polite, proxies=f"{dead},{live.url()}", retry_delays_s=(0.2,))
    caplog.set_level(logging.DEBUG)
    with LoggedSite(pages_route) as site:
        urls = [site.url(f"/p/{n}") for n in range(6)]
        report = crawl_in_threads(settings, urls, threads=1, run_s=30)
    assert sorted(report.done) == sorted(urls)
    assert report.deferred_or_retried == 0  # each failed request went on through the other proxy
    dead_label = Proxy.parse(dead).label
    client = connect_redis(settings, OPERATOR)
    bench_ms = client.pttl(Keys(settings.redis_prefix).proxy_bench(dead_label))
    client.close()
    assert 25_000 < bench_ms <= 30_000
    assert rows(settings, "SELECT DISTINCT proxy FROM pages") == [(live.label(),)]
    assert PASSWORD not in caplog.text


def test_wrong_credentials_count_as_a_proxy_failure(polite: Settings, proxies: list[ForwardProxy]) -> None:
    proxy = ForwardProxy(credentials="crawler:right")
    proxies.append(proxy)
    settings = dataclasses.replace(polite, proxies=proxy.url("crawler:wrong@"), max_attempts=1)
    with LoggedSite(pages_route) as site:
        report = crawl_in_threads(settings, [site.url("/a")], threads=1, run_s=10)
        assert site.hits == []
    assert report.dead == [site.url("/a")]  # robots.txt unreachable through a refusing proxy


def test_when_every_proxy_is_benched_urls_wait(polite: Settings) -> None:
    client = connect_redis(polite, OPERATOR)
    bench = RedisBench(client, Keys(polite.redis_prefix), max_failures=1, bench_s=5.0)
    one, two = parse_proxies("http://127.0.0.1:1,http://127.0.0.1:2")
    pool = ProxyPool([one, two], "random", bench, random.Random(7))
    pool.failed(one, TransientError("proxy_error"))
    assert {pool.choose() for _ in range(20)} == {two}  # random, among the usable only
    pool.failed(two, TransientError("proxy_error"))
    with pytest.raises(TryLater) as caught:
        pool.choose()
    assert caught.value.reason == "proxies_benched" and 4.0 < caught.value.wait_s <= 5.0
    client.close()


@pytest.mark.parametrize(
    "raw", ["ftp://u:pw@host:21", "http://u:pw@host", "u:pw@host:8080", "http://u:pw@[::1"]
)
def test_bad_proxy_urls_are_config_errors_that_hide_the_password(raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_proxies(raw)
    assert "pw" not in str(caught.value)


def sitemap_route(pages: int) -> Route:
    """robots.txt naming a sitemap of `pages` pages; the pages themselves are not asked for here."""

    def route(hit: Hit) -> Answer:
        if hit.path == "/robots.txt":
            return Answer(200, f"User-agent: *\nSitemap: http://{hit.domain}/sitemap.xml\n".encode())
        if hit.path == "/sitemap.xml":
            locs = "".join(f"<url><loc>http://{hit.domain}/p/{n}</loc></url>" for n in range(pages))
            body = f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'
            return Answer(200, body.encode(), {"Content-Type": "application/xml"})
        return Answer(404)

    return route


@pytest.mark.timeout(60)
def test_the_producer_reads_robots_and_sitemaps_through_the_proxies(
    polite: Settings, proxies: list[ForwardProxy]
) -> None:
    proxies.extend([ForwardProxy(credentials=f"crawler:{PASSWORD}"), ForwardProxy()])
    urls = [proxies[0].url(f"crawler:{PASSWORD}@"), proxies[1].url()]
    settings = dataclasses.replace(polite, proxies=",".join(urls))
    with LoggedSite(sitemap_route(pages=4)) as site:
        root = f"http://127.0.0.1:{site.port}"
        summary = run(settings, Options(run_id="via-proxies", sites=(root + "/",)))
        site_paths = sorted(hit.path for hit in site.hits)

    assert summary["enqueued_total"] == 4 and summary["sitemaps_failed"] == []
    assert site_paths == ["/robots.txt", "/sitemap.xml"]
    # One request each, taken in turn: nothing went to the site directly.
    assert sorted(len(p.seen) for p in proxies) == [1, 1]
    assert sorted(seen for p in proxies for seen in p.seen) == [root + "/robots.txt", root + "/sitemap.xml"]


@pytest.mark.timeout(60)
def test_the_producer_benches_a_failing_proxy_and_reads_through_another(
    polite: Settings, proxies: list[ForwardProxy], caplog: pytest.LogCaptureFixture
) -> None:
    live = ForwardProxy()
    proxies.append(live)
    dead = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}"
    settings = dataclasses.replace(polite, proxies=f"{dead},{live.url()}", proxy_max_failures=1)
    caplog.set_level(logging.DEBUG)
    with LoggedSite(sitemap_route(pages=3)) as site:
        root = f"http://127.0.0.1:{site.port}"
        summary = run(settings, Options(run_id="past-a-dead-proxy", sites=(root + "/",)))

    assert summary["enqueued_total"] == 3 and summary["sitemaps_failed"] == []
    assert sorted(live.seen) == [root + "/robots.txt", root + "/sitemap.xml"]
    client = connect_redis(settings, OPERATOR)
    try:  # benched for the workers too: the bench is shared through Redis
        assert client.pttl(Keys(settings.redis_prefix).proxy_bench(Proxy.parse(dead).label)) > 0
    finally:
        client.close()
    assert PASSWORD not in caplog.text


def test_when_every_proxy_fails_the_sitemap_fails_with_a_reason(polite: Settings) -> None:
    dead = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}"
    settings = dataclasses.replace(polite, proxies=dead)
    with LoggedSite(sitemap_route(pages=3)) as site:
        sitemap = f"http://127.0.0.1:{site.port}/sitemap.xml"
        summary = run(settings, Options(run_id="no-proxy-left", sitemaps=(sitemap,)))
        assert site.hits == []  # never fetched directly

    assert summary["enqueued_total"] == 0
    (failure,) = summary["sitemaps_failed"]
    assert failure["url"] == sitemap and failure["error"].startswith("proxy http://127.0.0.1:")
    assert PASSWORD not in str(summary)
