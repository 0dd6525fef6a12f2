"""The demo site, started in-process on loopback addresses and a free port."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from demo_site import DemoSite, Kind, SiteConfig
from demo_site.__main__ import main
from demo_site.routes import answer
from demo_site.runner import serve_demo_site
from demo_site.state import SiteState
from shared.errors import ServiceUnavailable

REPO = Path(__file__).resolve().parents[2]
NS = {"sm": "http://www.sitemaps.org/schemas/sitemap/0.9"}


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


def fetch(url: str, method: str = "GET", host_header: str | None = None) -> Response:
    """One request on its own connection, closed before returning; no decoding of any kind."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        headers = {"Host": host_header} if host_header else {}
        connection.request(method, parts.path or "/", headers=headers)
        response = connection.getresponse()
        body = response.read()
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
    finally:
        connection.close()


def canonical(url: str) -> str:
    """The test's own idea of canonical: lower-case scheme and host, no fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, parts.query, ""))


def locs(xml: bytes) -> list[str]:
    return [loc.text or "" for loc in ET.fromstring(xml).iterfind(".//sm:loc", NS)]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "requests.jsonl"


@pytest.fixture
def site(log_path: Path) -> Iterator[DemoSite]:
    with DemoSite(SiteConfig(port=0), log_path=log_path) as running:
        yield running


def url(site: DemoSite, host: int, kind: Kind, number: int) -> str:
    return site.config.url(host, kind, number)


def test_a_free_port_is_picked_and_shared_by_every_host(site: DemoSite) -> None:
    assert site.config.port != 0
    for host in range(len(site.config.hosts)):
        assert fetch(url(site, host, Kind.PAGE, 1)).status == 200


def test_robots_on_the_first_host_points_at_the_sitemap_index(site: DemoSite) -> None:
    first = fetch(site.config.origin(0) + "/robots.txt").text
    assert "User-agent: *" in first
    assert "Allow: /" in first
    assert f"Sitemap: http://127.0.0.2:{site.config.port}/sitemap_index.xml" in first
    for host in (1, 2):
        other = fetch(site.config.origin(host) + "/robots.txt")
        assert other.status == 200
        assert "Allow: /" in other.text
        assert "Sitemap:" not in other.text


def test_sitemap_index_points_at_a_plain_and_a_gzipped_child(site: DemoSite) -> None:
    index = fetch(site.config.sitemap_index_url)
    assert index.status == 200
    assert ET.fromstring(index.body).tag == f"{{{NS['sm']}}}sitemapindex"
    origin = site.config.origin(0)
    assert locs(index.body) == [origin + "/sitemaps/pages.xml", origin + "/sitemaps/more.xml.gz"]

    plain = fetch(origin + "/sitemaps/pages.xml")
    assert plain.status == 200
    assert plain.headers["content-type"] == "application/xml"
    assert locs(plain.body)

    gzipped = fetch(origin + "/sitemaps/more.xml.gz")
    assert gzipped.status == 200
    assert fetch(origin + "/sitemaps/more.xml.gz").body == gzipped.body  # same bytes every time
    assert gzipped.headers["content-type"] == "application/gzip"
    # Served as a gzip file, not as a compressed transfer: the client must inflate it itself.
    assert "content-encoding" not in gzipped.headers
    assert gzipped.body[:2] == b"\x1f\x8b"
    assert locs(gzip.decompress(gzipped.body))


def test_sitemap_entries_match_expected_urls(site: DemoSite) -> None:
    origin = site.config.origin(0)
    plain = locs(fetch(origin + "/sitemaps/pages.xml").body)
    gzipped = locs(gzip.decompress(fetch(origin + "/sitemaps/more.xml.gz").body))
    everything = plain + gzipped
    expected = site.config.expected()

    assert len(everything) == expected.sitemap_entries == 3 * (20 + 3 + 2 + 2 + 2) + 3
    assert {canonical(loc) for loc in everything} == set(expected.unique)
    assert len(set(expected.unique)) == expected.unique_total
    respelled = [loc for loc in everything if loc != canonical(loc)]
    assert len(respelled) == expected.duplicates == 3
    # Each child holds URLs of every host, so both files matter to a crawl.
    for child in (plain, gzipped):
        assert {urlsplit(loc).hostname for loc in child} == set(site.config.hosts)


def sitemap_urls(site: DemoSite) -> list[ET.Element]:
    origin = site.config.origin(0)
    plain = fetch(origin + "/sitemaps/pages.xml").body
    gzipped = gzip.decompress(fetch(origin + "/sitemaps/more.xml.gz").body)
    return [entry for body in (plain, gzipped) for entry in ET.fromstring(body).iterfind("sm:url", NS)]


def test_priority_entries_are_the_first_pages_of_each_host(site: DemoSite) -> None:
    top: list[str] = []
    for entry in sitemap_urls(site):
        if entry.findtext("sm:priority", namespaces=NS) == "1.0":
            top.append(entry.findtext("sm:loc", namespaces=NS) or "")
    expected = site.config.expected().priority
    assert sorted(top) == sorted(expected)
    assert len(expected) == 3 * 2
    assert all("/pages/1.html" in u or "/pages/2.html" in u for u in expected)


def test_only_priority_says_what_is_urgent(site: DemoSite) -> None:
    """No recent lastmod anywhere: news must be told apart by its URL, not by freshness."""
    for entry in sitemap_urls(site):
        lastmod = entry.findtext("sm:lastmod", namespaces=NS)
        if entry.findtext("sm:priority", namespaces=NS) == "1.0":
            assert lastmod is None
        else:
            assert lastmod == "2015-06-01"


def test_normal_page_has_what_an_extractor_needs(site: DemoSite) -> None:
    page_url = url(site, 1, Kind.PAGE, 4)
    response = fetch(page_url)
    assert response.status == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    html = response.text
    assert '<html lang="en">' in html
    assert "<title>Demo page 4 on 127.0.0.3</title>" in html
    assert '<meta name="description"' in html
    assert f'<link rel="canonical" href="{page_url}">' in html
    assert "<h1>Demo page 4 on 127.0.0.3</h1>" in html
    assert html.count("<p>") == 3
    assert "<script>" in html and "<style>" in html
    assert 'href="/pages/5.html"' in html
    assert f'href="{url(site, 2, Kind.PAGE, 1)}"' in html
    # Same bytes on every request: a deterministic site.
    assert fetch(page_url).body == response.body


def test_news_page_answers_200(site: DemoSite) -> None:
    assert fetch(url(site, 0, Kind.NEWS, 3)).status == 200


def test_flaky_page_fails_twice_then_succeeds_counted_per_host_and_path(site: DemoSite) -> None:
    statuses = [fetch(url(site, 1, Kind.FLAKY, 1)).status for _ in range(4)]
    assert statuses == [500, 500, 200, 200]
    # The same path on another host has its own count.
    assert fetch(url(site, 2, Kind.FLAKY, 1)).status == 500


def test_broken_page_answers_500_until_fixed_and_again_after_reset(site: DemoSite) -> None:
    broken = url(site, 0, Kind.BROKEN, 2)
    assert fetch(broken).status == 500
    assert fetch(broken).status == 500
    # The fix is site-wide, whichever host receives it.
    assert fetch(site.config.origin(2) + "/__control/fix", method="POST").status == 200
    assert fetch(broken).status == 200
    assert fetch(url(site, 1, Kind.BROKEN, 1)).status == 200

    assert fetch(site.config.origin(0) + "/__control/reset", method="POST").status == 200
    assert fetch(broken).status == 500


def test_reset_restarts_flaky_counts(site: DemoSite) -> None:
    flaky = url(site, 0, Kind.FLAKY, 2)
    assert [fetch(flaky).status for _ in range(3)] == [500, 500, 200]
    site.reset()
    assert fetch(flaky).status == 500


@pytest.mark.parametrize(
    "path",
    [
        "/missing/1.html",
        "/pages/21.html",
        "/pages/0.html",
        "/other/1.html",
        "/",
        "/sitemaps/pages.xml?x=1#",
    ],
)
def test_missing_and_unknown_paths_are_404(site: DemoSite, path: str) -> None:
    target = site.config.origin(1) + path  # sitemaps live on the first host only
    assert fetch(target).status == 404


def test_missing_pages_are_listed_in_the_sitemap_but_404(site: DemoSite) -> None:
    for missing in site.config.expected().missing:
        assert fetch(missing).status == 404


def test_head_gives_the_status_without_a_body(site: DemoSite) -> None:
    response = fetch(url(site, 0, Kind.PAGE, 1), method="HEAD")
    assert response.status == 200
    assert response.body == b""
    assert int(response.headers["content-length"]) > 0


def test_requests_are_logged_in_memory_and_to_the_file(site: DemoSite, log_path: Path) -> None:
    fetch(url(site, 0, Kind.PAGE, 1))
    fetch(url(site, 2, Kind.MISSING, 2))
    fetch(site.config.origin(1) + "/__control/fix", method="POST")

    port = site.config.port
    seen = [(r.host, r.method, r.path, r.status) for r in site.records()]
    assert seen == [
        (f"127.0.0.2:{port}", "GET", "/pages/1.html", 200),
        (f"127.0.0.4:{port}", "GET", "/missing/2.html", 404),
        (f"127.0.0.3:{port}", "POST", "/__control/fix", 200),
    ]
    lines = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    assert [(d["host"], d["method"], d["path"], d["status"]) for d in lines] == seen
    assert all(set(d) == {"t", "host", "method", "path", "status"} for d in lines)
    assert lines[0]["t"] <= lines[-1]["t"]


def test_public_names_serve_every_host_from_one_address() -> None:
    config = SiteConfig(hosts=("127.0.0.1",), public_names=("site-a", "site-b", "site-c"), port=0)
    with DemoSite(config) as running:
        port = running.config.port
        address = f"http://127.0.0.1:{port}"
        robots = fetch(address + "/robots.txt", host_header=f"site-a:{port}").text
        assert f"Sitemap: http://site-a:{port}/sitemap_index.xml" in robots
        page = fetch(address + "/pages/2.html", host_header=f"site-b:{port}").text
        assert "<title>Demo page 2 on site-b</title>" in page
        assert f'href="http://site-c:{port}/pages/1.html"' in page
        # Sitemaps exist on the first public name only.
        assert fetch(address + "/sitemap_index.xml", host_header=f"site-b:{port}").status == 404
        index = fetch(address + "/sitemap_index.xml", host_header=f"site-a:{port}")
        assert locs(index.body)[0] == f"http://site-a:{port}/sitemaps/pages.xml"
        assert running.records()[-1].host == f"site-a:{port}"
        assert running.config.expected().normal[0] == f"http://site-a:{port}/pages/1.html"


def test_slow_pages_ask_for_a_delay_but_robots_does_not() -> None:
    config = SiteConfig(slow_ms=250)
    state = SiteState()
    assert answer(config, state, 0, "GET", "/pages/1.html").delay_s == 0.25
    assert answer(config, state, 0, "GET", "/robots.txt").delay_s == 0


def test_expected_counts_follow_the_config() -> None:
    config = SiteConfig(
        hosts=("127.0.0.2", "127.0.0.3"), port=8431, pages_per_host=5, news_per_host=1,
        flaky_per_host=1, broken_per_host=0, missing_per_host=3, priority_per_host=1,
        duplicate_entries=2,
    )  # fmt: skip
    expected = config.expected()
    assert len(expected.normal) == 2 * (5 + 1)
    assert expected.news == ("http://127.0.0.2:8431/news/1.html", "http://127.0.0.3:8431/news/1.html")
    assert expected.broken == ()
    assert len(expected.missing) == 6
    assert expected.unique_total == 12 + 2 + 0 + 6
    assert expected.sitemap_entries == 22
    assert expected.normal[0] == "http://127.0.0.2:8431/pages/1.html"


def test_port_80_is_left_out_of_urls() -> None:
    assert SiteConfig(port=80).url(0, Kind.PAGE, 1) == "http://127.0.0.2/pages/1.html"


@pytest.mark.parametrize(
    "change",
    [
        {"hosts": ()},
        {"port": 70000},
        {"pages_per_host": -1},
        {"priority_per_host": 21},
        {"duplicate_entries": 61},
        {"hosts": ("127.0.0.2", "127.0.0.3"), "public_names": ("a", "b", "c")},
    ],
)
def test_impossible_configs_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SiteConfig(**change)  # type: ignore[arg-type]


def test_cli_refuses_an_impossible_config_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--pages-per-host", "1", "--priority-per-host", "2"])
    assert exit_info.value.code == 2
    assert "priority_per_host" in capsys.readouterr().err


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def test_cli_announces_the_sitemap_index_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = free_port("127.0.0.2")
    log = tmp_path / "cli.jsonl"
    command = [sys.executable, "-m", "demo_site", "--hosts", "127.0.0.2", "--port", str(port)]
    with subprocess.Popen(
        [*command, "--log", str(log)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line == f"demo site: sitemap index at http://127.0.0.2:{port}/sitemap_index.xml\n"
            assert fetch(f"http://127.0.0.2:{port}/robots.txt").status == 200
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, err
    assert json.loads(log.read_text(encoding="utf-8"))["path"] == "/robots.txt"


def test_runner_serves_the_site_as_a_child_process_and_stops_it(tmp_path: Path) -> None:
    port = free_port("127.0.0.2")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with serve_demo_site(tmp_path, env, "--hosts", "127.0.0.2", "--port", str(port)) as root:
        assert root == f"http://127.0.0.2:{port}/"
        assert fetch(root + "robots.txt").status == 200
    with pytest.raises(OSError):
        fetch(root + "robots.txt")
    logged = json.loads((tmp_path / "site-requests.jsonl").read_text(encoding="utf-8"))
    assert (logged["path"], logged["status"]) == ("/robots.txt", 200)


def test_runner_reports_a_site_that_cannot_start_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with (
            pytest.raises(ServiceUnavailable, match=r"cannot listen on 127\.0\.0\.2 port"),
            serve_demo_site(tmp_path, env, "--hosts", "127.0.0.2", "--port", port),
        ):
            pass


def test_disallowed_pages_and_invalid_entries_are_listed_when_asked_for() -> None:
    """The compose demo asks for both, so that a crawl of it records skips and refuses URLs."""
    config = SiteConfig(port=8431, disallowed_per_host=1, invalid_entries=2)
    state = SiteState()
    expected = config.expected()

    assert expected.disallowed == tuple(f"http://{h}:8431/private/1.html" for h in config.hosts)
    assert set(expected.disallowed) <= set(expected.unique)
    assert expected.sitemap_entries == expected.unique_total + expected.duplicates + 2
    robots = answer(config, state, 1, "GET", "/robots.txt").body.decode()
    assert "Disallow: /private/" in robots.splitlines()
    # Served all the same: only a crawler that reads robots.txt leaves it alone.
    assert answer(config, state, 1, "GET", "/private/1.html").status == 200
    plain = answer(config, state, 0, "GET", "/sitemaps/pages.xml").body
    gzipped = gzip.decompress(answer(config, state, 0, "GET", "/sitemaps/more.xml.gz").body)
    listed = [entry.findtext("sm:loc", namespaces=NS) or "" for body in (plain, gzipped)
              for entry in ET.fromstring(body).iterfind("sm:url", NS)]  # fmt: skip
    assert len(listed) == expected.sitemap_entries
    assert sum(loc.startswith("ftp://") for loc in listed) == 2
    assert "Disallow" not in answer(SiteConfig(), state, 1, "GET", "/robots.txt").body.decode()
