"""SOCKS5 proxies, through a real SOCKS5 proxy on loopback (tests/socks_proxy.py) in front of a
local site: socks5h:// names the host to the proxy, socks5:// an address; a refused login is a
proxy failure; the password shows nowhere."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from bench.site import LoggedSite, pages_route
from shared.postgres import db
from shared.settings import Settings
from tests.integration.test_politeness import crawl_in_threads, rows
from tests.socks_proxy import SocksProxy

PASSWORD = "s0cks-pw"


@pytest.fixture
def polite(settings: Settings) -> Iterator[Settings]:
    db.ensure_schema(settings)
    yield dataclasses.replace(settings, rate_limit_rps=50.0, proxy_max_failures=2, proxy_bench_s=30.0)


@pytest.fixture
def socks() -> Iterator[SocksProxy]:
    proxy = SocksProxy("crawler", PASSWORD).start()
    yield proxy
    proxy.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("scheme", "host"), [("socks5h", "localhost"), ("socks5", "127.0.0.1")])
def test_pages_come_through_a_socks5_proxy(
    polite: Settings, socks: SocksProxy, caplog: pytest.LogCaptureFixture, scheme: str, host: str
) -> None:
    settings = dataclasses.replace(polite, proxies=socks.url(scheme))
    caplog.set_level(logging.DEBUG)
    with LoggedSite(pages_route) as site:
        port = site.port
        urls = [f"http://localhost:{port}/a", f"http://localhost:{port}/b"]
        report = crawl_in_threads(settings, urls, threads=2, run_s=20)
        paths = sorted(hit.path for hit in site.hits)
    assert sorted(report.done) == urls
    assert paths == ["/a", "/b", "/robots.txt"]
    # socks5h leaves the name to the proxy; socks5 resolves it here and hands over the address.
    assert set(socks.targets) == {(host, port)}
    assert rows(settings, "SELECT DISTINCT proxy FROM pages") == [(f"{scheme}://127.0.0.1:{socks.port}",)]
    assert PASSWORD not in caplog.text


@pytest.mark.timeout(60)
def test_a_refused_socks_login_is_a_proxy_failure(
    polite: Settings, socks: SocksProxy, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = socks.url().replace(PASSWORD, "wrong")
    settings = dataclasses.replace(polite, proxies=wrong, max_attempts=1, proxy_max_failures=1)
    caplog.set_level(logging.INFO)
    with LoggedSite(pages_route) as site:
        report = crawl_in_threads(settings, [site.url("/a")], threads=1, run_s=10)
        assert site.hits == []
    assert socks.refused_logins >= 1
    assert report.dead == [site.url("/a")]  # robots.txt unreachable through the refusing proxy
    label = f"socks5h://127.0.0.1:{socks.port}"
    assert f"proxy {label} benched after repeated failures: proxy_error" in caplog.text
    # The proxy's health as metrics: its failures counted, and (benched by the first) not usable.
    failures = REGISTRY.get_sample_value("crawl_proxy_failures_total", {"proxy": label})
    assert failures == socks.refused_logins >= 1
    assert REGISTRY.get_sample_value("crawl_proxy_usable", {"proxy": label}) == 0
    assert "crawler:" not in caplog.text and PASSWORD not in caplog.text
