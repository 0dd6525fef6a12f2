"""Fetcher against a tiny HTTP server on 127.0.0.1, and classify() over every status."""

from __future__ import annotations

import dataclasses
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from shared.errors import PermanentError, TransientError
from shared.settings import Settings
from worker.fetch.fetcher import Fetcher, Validators
from worker.fetch.verdicts import Verdict, classify, is_html, media_type
from worker.parse.page import decode_html

HTML = "<html><head><title>Café</title></head><body>hello</body></html>"
ETAG = '"v1"'
# The paths whose answer never changes: path -> (status, body, content type, headers).
FIXED_ANSWERS: dict[str, tuple[int, bytes, str | None, dict[str, str]]] = {
    "/page": (
        200,
        HTML.encode(),
        "text/html; charset=utf-8",
        {"ETag": ETAG, "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"},
    ),
    "/404": (404, b"no", "text/html", {}),
    "/500": (500, b"no", "text/html", {}),
    "/503": (503, b"busy", "text/html", {"Retry-After": "120"}),
    "/loop": (301, b"", None, {"Location": "/loop2"}),
    "/loop2": (301, b"", None, {"Location": "/loop"}),
    "/no-location": (302, b"", None, {}),
    "/pdf": (200, b"%PDF-1.4", "application/pdf", {}),
    "/big": (200, b"a" * 5000, "text/html", {}),
    # Small on the wire, large once inflated.
    "/gzip-bomb": (200, gzip.compress(b"a" * 50_000), "text/html", {"Content-Encoding": "gzip"}),
}


class Handler(BaseHTTPRequestHandler):
    """Routes by path. Each path is one behaviour a fetch has to cope with."""

    server: LocalSite

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.server.requests.append((self.path, dict(self.headers.items())))
        path = self.path
        if path in FIXED_ANSWERS:
            self._send(*FIXED_ANSWERS[path])
        elif path == "/etag":
            if self.headers.get("If-None-Match") == ETAG:
                self._send(304, b"", None, {"ETag": ETAG})
            else:
                self._send(200, HTML.encode(), "text/html", {"ETag": ETAG})
        elif path.startswith("/hop/"):  # /hop/3 -> /hop/2 -> /hop/1 -> /page
            left = int(path.rsplit("/", 1)[1])
            # Every form of Location: relative path, absolute URL, absolute path.
            targets = {3: "2", 2: self.server.url("/hop/1"), 1: "/page"}
            self._send(302, b"", None, {"Location": targets[left]})
        elif path == "/big-undeclared":  # HTTP/1.0, no Content-Length: the body ends at close
            self._send(200, b"a" * 5000, "text/html", declare_length=False)
        elif path == "/drip":
            self._drip()
        else:
            self._send(404, b"", "text/plain")

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str | None,
        headers: dict[str, str] | None = None,
        declare_length: bool = True,
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        if declare_length:
            self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b"a")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the client gave up, as it should


class LocalSite(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[tuple[str, dict[str, str]]] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


@pytest.fixture(scope="module")
def site() -> Iterator[LocalSite]:
    server = LocalSite()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def loopback_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # never route loopback test traffic through an environment proxy
    return session


@pytest.fixture
def fetcher_settings() -> Settings:
    return dataclasses.replace(
        Settings(), max_body_bytes=1000, fetch_deadline_s=1.0, max_redirects=3, user_agent="test-agent/1"
    )


@pytest.fixture
def fetcher(fetcher_settings: Settings) -> Iterator[Fetcher]:
    with Fetcher(fetcher_settings, session_factory=loopback_session) as made:
        yield made


def test_200_html_gives_body_headers_and_timing(site: LocalSite, fetcher: Fetcher) -> None:
    result = fetcher.fetch(site.url("/page"))
    assert result.status == 200
    assert result.final_url == site.url("/page")
    assert result.body == HTML.encode()
    assert decode_html(result.body, result.content_type) == HTML
    assert result.content_type == "text/html; charset=utf-8"
    assert result.etag == ETAG
    assert result.last_modified == "Mon, 01 Jan 2024 00:00:00 GMT"
    assert (result.not_modified, result.from_cache, result.proxy) == (False, False, None)
    assert result.fetch_ms is not None and 0 <= result.fetch_ms < 1000
    assert site.requests[-1][1]["User-Agent"] == "test-agent/1"


def test_404_is_permanent(site: LocalSite, fetcher: Fetcher) -> None:
    with pytest.raises(PermanentError) as caught:
        fetcher.fetch(site.url("/404"))
    assert (caught.value.reason, caught.value.http_status) == ("http_404", 404)


def test_500_is_transient(site: LocalSite, fetcher: Fetcher) -> None:
    with pytest.raises(TransientError) as caught:
        fetcher.fetch(site.url("/500"))
    assert (caught.value.reason, caught.value.http_status) == ("http_500", 500)


def test_503_reports_retry_after(site: LocalSite, fetcher: Fetcher) -> None:
    with pytest.raises(TransientError) as caught:
        fetcher.fetch(site.url("/503"))
    assert caught.value.reason == "http_503"
    assert caught.value.detail == "Retry-After: 120"


def test_three_redirects_are_followed_and_each_hop_checked(
    site: LocalSite, fetcher_settings: Settings
) -> None:
    checked: list[str] = []
    with Fetcher(fetcher_settings, loopback_session, check_url=checked.append) as fetcher:
        result = fetcher.fetch(site.url("/hop/3"))
    assert result.final_url == site.url("/page")
    assert result.body == HTML.encode()
    assert checked == [site.url(p) for p in ("/hop/3", "/hop/2", "/hop/1", "/page")]


def test_a_refusing_check_stops_the_chain_before_the_hop_is_requested(
    site: LocalSite, fetcher_settings: Settings
) -> None:
    def refuse_page(url: str) -> None:
        if url.endswith("/page"):
            raise PermanentError("blocked_address", url)

    requested_before = len(site.requests)
    with (
        Fetcher(fetcher_settings, loopback_session, check_url=refuse_page) as fetcher,
        pytest.raises(PermanentError) as caught,
    ):
        fetcher.fetch(site.url("/hop/1"))
    assert caught.value.reason == "blocked_address"
    assert [path for path, _ in site.requests[requested_before:]] == ["/hop/1"]


def test_more_redirects_than_allowed_is_an_error(site: LocalSite, fetcher_settings: Settings) -> None:
    short = dataclasses.replace(fetcher_settings, max_redirects=2)
    with Fetcher(short, loopback_session) as fetcher, pytest.raises(PermanentError) as caught:
        fetcher.fetch(site.url("/hop/3"))
    assert caught.value.reason == "redirect_loop"


def test_redirect_loop_is_an_error(site: LocalSite, fetcher: Fetcher) -> None:
    with pytest.raises(PermanentError) as caught:
        fetcher.fetch(site.url("/loop"))
    assert caught.value.reason == "redirect_loop"


def test_redirect_without_location_is_an_error(site: LocalSite, fetcher: Fetcher) -> None:
    with pytest.raises(PermanentError) as caught:
        fetcher.fetch(site.url("/no-location"))
    assert caught.value.reason == "bad_redirect"


def test_non_html_is_refused_before_the_body_is_read(site: LocalSite, fetcher: Fetcher) -> None:
    with pytest.raises(PermanentError) as caught:
        fetcher.fetch(site.url("/pdf"))
    assert caught.value.reason == "unsupported_content"
    assert "application/pdf" in caught.value.detail


@pytest.mark.parametrize("path", ["/big", "/big-undeclared", "/gzip-bomb"])
def test_body_over_the_cap_is_too_large(site: LocalSite, fetcher: Fetcher, path: str) -> None:
    with pytest.raises(PermanentError) as caught:
        fetcher.fetch(site.url(path))
    assert caught.value.reason == "too_large"


def test_slow_drip_body_hits_the_deadline(site: LocalSite, fetcher: Fetcher) -> None:
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        fetcher.fetch(site.url("/drip"))
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 2.0  # deadline 1 s; the whole body would take 50 s


def test_matching_etag_gives_not_modified(site: LocalSite, fetcher: Fetcher) -> None:
    result = fetcher.fetch(site.url("/etag"), Validators(etag=ETAG))
    assert (result.status, result.not_modified, result.body) == (304, True, b"")
    assert site.requests[-1][1]["If-None-Match"] == ETAG


def test_changed_etag_gives_the_page(site: LocalSite, fetcher: Fetcher) -> None:
    result = fetcher.fetch(site.url("/etag"), Validators(etag='"old"'))
    assert (result.status, result.not_modified) == (200, False)
    assert result.body == HTML.encode()


def test_last_modified_is_sent_as_if_modified_since(site: LocalSite, fetcher: Fetcher) -> None:
    fetcher.fetch(site.url("/page"), Validators(last_modified="Sun, 31 Dec 2023 00:00:00 GMT"))
    sent = site.requests[-1][1]
    assert sent["If-Modified-Since"] == "Sun, 31 Dec 2023 00:00:00 GMT"
    assert "If-None-Match" not in sent


def test_refused_connection_is_transient(fetcher: Fetcher) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransientError) as caught:
        fetcher.fetch(f"http://127.0.0.1:{port}/")
    assert caught.value.reason == "connection_error"


@pytest.mark.parametrize("url", ["not a url", "ftp://127.0.0.1/x", "http:///path", ""])
def test_invalid_urls_are_permanent(fetcher: Fetcher, url: str) -> None:
    with pytest.raises(PermanentError) as caught:
        fetcher.fetch(url)
    assert caught.value.reason == "invalid_url"


# classify(): pure, so every status gets checked.

TRANSIENT = {408, 429, *range(500, 600)}


def expected_outcome(status: int) -> str:
    if 200 <= status < 300:
        return "ok"
    if status == 304:
        return "not_modified"
    if 300 <= status < 400:
        return "redirect"
    return "transient" if status in TRANSIENT else "permanent"


def outcome(status: int) -> str:
    try:
        verdict = classify(status, content_type="text/html", location="/x", conditional=True)
    except TransientError as exc:
        assert (exc.reason, exc.http_status) == (f"http_{status}", status)
        return "transient"
    except PermanentError as exc:
        assert (exc.reason, exc.http_status) == (f"http_{status}", status)
        return "permanent"
    return verdict.value


def test_classify_every_status() -> None:
    wrong = {s: outcome(s) for s in range(100, 600) if outcome(s) != expected_outcome(s)}
    assert wrong == {}


@pytest.mark.parametrize("status", [300, 301, 302, 303, 307, 308])
@pytest.mark.parametrize("location", [None, "", "   "])
def test_classify_redirect_without_location(status: int, location: str | None) -> None:
    with pytest.raises(PermanentError) as caught:
        classify(status, location=location)
    assert caught.value.reason == "bad_redirect"


def test_classify_304_needs_a_conditional_request() -> None:
    with pytest.raises(PermanentError) as caught:
        classify(304)
    assert caught.value.reason == "http_304"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/html",
        "text/html; charset=ISO-8859-1",
        "TEXT/HTML",
        "application/xhtml+xml",
        " application/xhtml+xml ; charset=utf-8",
    ],
)
def test_classify_accepts_html(content_type: str) -> None:
    assert classify(200, content_type=content_type) is Verdict.OK


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "application/pdf",
        "text/plain",
        "image/png",
        "application/json",
        "text/htmlx",
    ],
)
def test_classify_refuses_other_content(content_type: str | None) -> None:
    with pytest.raises(PermanentError) as caught:
        classify(200, content_type=content_type)
    assert (caught.value.reason, caught.value.http_status) == ("unsupported_content", 200)


@pytest.mark.parametrize("status", [408, 429, 503])
def test_classify_carries_retry_after(status: int) -> None:
    with pytest.raises(TransientError) as caught:
        classify(status, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")
    assert caught.value.detail == "Retry-After: Wed, 21 Oct 2015 07:28:00 GMT"


def test_classify_without_retry_after_has_no_detail() -> None:
    with pytest.raises(TransientError) as caught:
        classify(429)
    assert caught.value.detail == ""


def test_media_type_helpers() -> None:
    assert media_type("Text/HTML; charset=utf-8") == "text/html"
    assert media_type(None) is None
    assert media_type(";charset=utf-8") is None
    assert is_html("application/xhtml+xml")
    assert not is_html("text/plain")
