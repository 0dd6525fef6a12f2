"""Hostile documents and servers: XML bombs and XXE, gzip bombs, endless and dripping bodies.

Each is refused within a time bound, and where memory is the attack, within a memory bound
measured with tracemalloc. A refused sitemap is recorded and the rest of the run goes on.
Servers here listen on 127.0.0.1 only.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar, TypeVar

import pytest

from producer.fetch import FetchFailed, HttpFetcher
from producer.sitemaps import SitemapError, SitemapReader, parse_sitemap
from shared.errors import PermanentError, TransientError
from shared.http.netguard import guarded_session
from shared.settings import Settings
from shared.urls import InvalidURL, canonicalize
from tests.unit.test_netguard import Canary
from worker.fetch.fetcher import Fetcher

MB = 1024 * 1024
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
ZEROS_GZIPPED_TWICE = gzip.compress(gzip.compress(b"\0" * (10 * MB)))
# 20 MB of valid entries: it takes the byte cap, not another limit, to stop it.
ENTRY = b"<url><loc>http://example.com/" + b"a" * 1000 + b"</loc></url>"
ENTRIES_GZIPPED = gzip.compress(b"<urlset>" + ENTRY * (20 * MB // len(ENTRY)))
T = TypeVar("T")


def measured(work: Callable[[], T]) -> tuple[T | BaseException, float, int]:
    """(result or raised exception, seconds of this process's CPU, peak bytes allocated while
    working). CPU, not wall clock: a loaded machine stretches the wall clock of a bounded piece of
    work, never its CPU, while work that is quadratic or never stops reading spends CPU past
    every limit below."""
    tracemalloc.start()
    started = time.process_time()
    try:
        outcome: T | BaseException = work()
    except Exception as exc:
        outcome = exc
    elapsed = time.process_time() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return outcome, elapsed, peak


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///etc/passwd", "scheme 'file' not http/https"),
        ("gopher://127.0.0.1:6379/_INFO", "scheme (other) not http/https"),
        ("http://evil.test\\@127.0.0.1/", "credentials in URL"),  # read as user 'evil.test\\'
        ("http://127.0.0.1%2f@evil.test/", "credentials in URL"),
        ("https://user:@example.com/", "credentials in URL"),
        ("http://example.com/\x7f", "contains whitespace or control characters"),
        ("http://example.com/a\u0085b", "contains whitespace or control characters"),
        ("http://example.com/" + "a" * 2100, "longer than 2048 characters"),
        ("http://example.com:0/", "invalid port"),
        ("http://a.b.c.1/", "invalid host (numeric, but not an IPv4 address)"),
        ("http://256.0.0.1/", "invalid host (numeric, but not an IPv4 address)"),
    ],
)
def test_hostile_urls_are_refused_with_a_reason_before_publishing(url: str, reason: str) -> None:
    # The producer counts each refusal by this reason and publishes nothing for it.
    with pytest.raises(InvalidURL) as refused:
        canonicalize(url)
    assert refused.value.detail == reason


def urlset(*locs: str) -> bytes:
    body = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
    return f'<?xml version="1.0"?><urlset {NS}>{body}</urlset>'.encode()


def billion_laughs() -> bytes:
    entities = ['<!ENTITY lol0 "lol">'] + [f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)]
    return (
        f'<?xml version="1.0"?><!DOCTYPE urlset [{"".join(entities)}]>'
        f"<urlset {NS}><url><loc>http://example.com/&lol9;</loc></url></urlset>"
    ).encode()


def quadratic_blowup() -> bytes:
    return (
        f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY a "{"a" * 100_000}">]>'
        f"<urlset {NS}><url><loc>http://example.com/{'&a;' * 10_000}</loc></url></urlset>"
    ).encode()


XXE_FILE = (
    b'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    b"<urlset><url><loc>http://example.com/&x;</loc></url></urlset>"
)
XINCLUDE = (
    b'<urlset xmlns:xi="http://www.w3.org/2001/XInclude">'
    b'<url><loc>http://example.com/a</loc><xi:include href="file:///etc/passwd" parse="text"/></url>'
    b"</urlset>"
)


def external_dtd(port: int) -> bytes:
    return (
        f'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "http://127.0.0.1:{port}/evil.dtd"><urlset/>'.encode()
    )


def parameter_entity(port: int) -> bytes:
    return (
        f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY % p SYSTEM "http://127.0.0.1:{port}/p.dtd"> %p;]>'
        "<urlset/>"
    ).encode()


@pytest.fixture
def canary() -> Iterator[Canary]:
    made = Canary()
    yield made
    made.close()


@pytest.mark.parametrize(
    ("name", "document"),
    [
        ("billion laughs", billion_laughs()),
        ("quadratic blowup", quadratic_blowup()),
        ("XXE file read", XXE_FILE),
    ],
)
def test_xml_entity_attacks_are_refused_fast_and_small(name: str, document: bytes) -> None:
    outcome, elapsed, peak = measured(lambda: list(parse_sitemap(document, "s", 50 * MB)))
    assert isinstance(outcome, SitemapError), name
    assert "DTD" in str(outcome)
    assert elapsed < 1.0
    assert peak < 4 * MB, f"peak {peak} bytes"


@pytest.mark.parametrize("document", [external_dtd, parameter_entity])
def test_external_dtds_are_never_fetched(document: Callable[[int], bytes], canary: Canary) -> None:
    with pytest.raises(SitemapError, match="DTD"):
        list(parse_sitemap(document(canary.port), "s", MB))
    assert canary.accepted() == 0


def test_xinclude_is_not_followed() -> None:
    entries = list(parse_sitemap(XINCLUDE, "s", MB))
    assert [e.url for e in entries] == ["http://example.com/a"]
    assert "root:" not in repr(entries)


def deep_nesting() -> bytes:
    return b"<urlset><url>" + b"<a>" * (MB // 3)


def giant_tag() -> bytes:
    return b"<urlset><url " + b" ".join(b'a%d="1"' % i for i in range(MB // 10)) + b"/></urlset>"


@pytest.mark.parametrize(
    ("document", "refusal"), [(deep_nesting, "nested deeper"), (giant_tag, "longer than")]
)
def test_deep_nesting_and_giant_tags_are_refused_small(document: Callable[[], bytes], refusal: str) -> None:
    body = document()
    outcome, elapsed, peak = measured(lambda: list(parse_sitemap(body, "s", 50 * MB)))
    assert isinstance(outcome, SitemapError) and refusal in str(outcome), outcome
    assert elapsed < 3.0 and peak < 16 * MB, f"{elapsed:.2f} s, peak {peak}"


def test_elements_nothing_reads_are_dropped_as_they_end() -> None:
    junk = b"<urlset><url><loc>http://example.com/a</loc>" + b"<x/>" * 20_000 + b"</url></urlset>"
    outcome, _, peak = measured(lambda: [e.url for e in parse_sitemap(junk, "s", 50 * MB)])
    assert outcome == ["http://example.com/a"]
    assert peak < 4 * MB


def test_a_run_goes_on_past_every_hostile_sitemap(canary: Canary) -> None:
    good = urlset("http://example.com/1", "http://example.com/2")
    hostile = {
        "http://s/laughs.xml": billion_laughs(),
        "http://s/quadratic.xml": quadratic_blowup(),
        "http://s/xxe.xml": XXE_FILE,
        "http://s/dtd.xml": external_dtd(canary.port),
        "http://s/bomb.xml.gz": ZEROS_GZIPPED_TWICE,
        "http://s/broken.xml": b"<urlset><url><loc>http://example.com/3</loc></url><url>",
        "http://s/child.xml": f"<sitemapindex {NS}><sitemap><loc>http://[oops</loc></sitemap></sitemapindex>".encode(),
    }
    index = f"<sitemapindex {NS}>" + "".join(f"<sitemap><loc>{u}</loc></sitemap>" for u in hostile)
    index += "<sitemap><loc>http://s/good.xml</loc></sitemap></sitemapindex>"
    pages = {**hostile, "http://s/index.xml": index.encode(), "http://s/good.xml": good}
    reader = SitemapReader(pages.__getitem__, max_depth=3, max_bytes=MB)
    outcome, elapsed, _ = measured(lambda: [e.url for e in reader.read("http://s/index.xml")])
    assert outcome == ["http://example.com/3", "http://example.com/1", "http://example.com/2"]
    assert {f.url for f in reader.failures} == {*hostile, "http://[oops"} - {"http://s/child.xml"}
    assert reader.sitemaps_read == 3  # the index, the child index and good.xml
    assert elapsed < 3.0
    assert canary.accepted() == 0


@pytest.mark.parametrize(
    ("bomb", "cap", "refusal"),
    [
        (lambda: ZEROS_GZIPPED_TWICE, MB, "gzip inside gzip"),
        (lambda: gzip.compress(b"\0" * (10 * MB)), MB, "binary data"),
        (lambda: ENTRIES_GZIPPED, MB, f"larger than {MB} bytes uncompressed"),
        (lambda: gzip.compress(b" " * (25 * MB)), 20 * MB, f"larger than {20 * MB} bytes uncompressed"),
    ],
    ids=["zeros gzipped twice", "zeros", "entries", "whitespace"],
)
def test_gzip_bombs_are_cut_at_the_decompressed_cap(
    bomb: Callable[[], bytes], cap: int, refusal: str
) -> None:
    body = bomb()
    assert len(body) < 100_000  # a few KB at most on the wire
    outcome, elapsed, peak = measured(lambda: sum(1 for _ in parse_sitemap(body, "s", cap)))
    assert isinstance(outcome, SitemapError) and refusal in str(outcome), outcome
    assert elapsed < 2.0, f"{elapsed:.2f} s"  # linear: no pass per chunk
    assert peak < 2 * MB, f"peak {peak} bytes"


def test_an_endless_line_in_a_text_sitemap_is_skipped_not_copied() -> None:
    body = gzip.compress(b"http://example.com/1\n" + b"a" * (40 * MB) + b"\nhttp://example.com/2\n")
    outcome, elapsed, peak = measured(lambda: [e.url for e in parse_sitemap(body, "s", 50 * MB)])
    assert outcome == ["http://example.com/1", "http://example.com/2"]
    assert elapsed < 2.0 and peak < 2 * MB


class HostileHandler(BaseHTTPRequestHandler):
    """Each path is one kind of hostile response."""

    routes: ClassVar[dict[str, tuple[bytes, dict[str, str]]]] = {
        "/gzip-bomb": (gzip.compress(b"\0" * (10 * MB)), {"Content-Encoding": "gzip"}),
        "/double-bomb": (ZEROS_GZIPPED_TWICE, {"Content-Encoding": "gzip, gzip"}),
        "/encoded-gz-file": (gzip.compress(ENTRIES_GZIPPED), {"Content-Encoding": "gzip"}),
        "/brotli": (b"\x0b\x02\x80hello\x03", {"Content-Encoding": "br"}),
        "/huge-declared": (b"<html>", {"Content-Length": str(10**12)}),
        "/sitemap.xml": (urlset("http://example.com/1"), {}),
        "/page": (b"<html>ok</html>", {}),
    }

    def do_GET(self) -> None:
        if self.path == "/endless":
            self._headers({})
            return self._write_forever()
        if self.path == "/drip":
            self._headers({"Content-Length": "100"})
            return self._drip()
        body, headers = self.routes[self.path]
        self._headers({"Content-Length": str(len(body)), **headers})
        self.wfile.write(body)

    def _headers(self, headers: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _write_forever(self) -> None:
        chunk = b"<p>" + b"a" * 59_997  # few tags: the byte cap, not the parse budget, must end it
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass  # the client hung up, as it should

    def _drip(self) -> None:
        try:
            for _ in range(100):
                self.wfile.write(b"a")
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    server = HostileServer(("127.0.0.1", 0), HostileHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


SETTINGS = dataclasses.replace(
    Settings(),
    fetch_allowlist="127.0.0.0/8",  # the hostile server is on loopback
    max_sitemap_bytes=MB,
    max_body_bytes=MB,
    fetch_deadline_s=1.5,  # the worker's; the producer allows sitemaps 4 times as long
)


@pytest.mark.parametrize(
    ("path", "refusal"),
    [
        ("/gzip-bomb", f"larger than {MB} bytes"),
        ("/double-bomb", f"larger than {MB} bytes"),
        ("/endless", f"larger than {MB} bytes"),
        ("/huge-declared", "Content-Length"),
        ("/brotli", "unsupported Content-Encoding 'br'"),
    ],
)
def test_producer_fetch_caps_decompressed_bytes(hostile: str, path: str, refusal: str) -> None:
    with HttpFetcher(SETTINGS) as fetch:
        outcome, elapsed, peak = measured(lambda: fetch(hostile + path))
    assert isinstance(outcome, FetchFailed) and refusal in str(outcome), outcome
    assert elapsed < 2.0
    assert peak < 4 * MB, f"peak {peak} bytes"


def test_producer_records_an_encoded_gzip_bomb_and_goes_on(hostile: str) -> None:
    with HttpFetcher(SETTINGS) as fetch:
        reader = SitemapReader(fetch, max_depth=1, max_bytes=MB)
        urls = [e.url for u in ("/encoded-gz-file", "/sitemap.xml") for e in reader.read(hostile + u)]
    assert urls[-1] == "http://example.com/1"  # after what the bomb gave before the cap
    assert len(urls) <= MB // len(ENTRY) + 1
    [failure] = reader.failures
    assert failure.error.startswith(f"larger than {MB} bytes uncompressed (after ")


def test_producer_fetch_meets_its_deadline_against_a_drip(hostile: str) -> None:
    settings = dataclasses.replace(SETTINGS, fetch_deadline_s=0.25)  # 1 s for a sitemap
    started = time.monotonic()
    with HttpFetcher(settings) as fetch, pytest.raises(FetchFailed, match="took longer than 1 s"):
        fetch(hostile + "/drip")
    assert time.monotonic() - started < 3.0  # 100 bytes at 1 byte/s would take 100 s


@pytest.fixture
def worker() -> Iterator[Fetcher]:
    with Fetcher(SETTINGS, session_factory=lambda: guarded_session(SETTINGS)) as made:
        yield made


def test_worker_cuts_a_one_byte_per_second_body_at_the_deadline(hostile: str, worker: Fetcher) -> None:
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        worker.fetch(hostile + "/drip")
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < SETTINGS.fetch_deadline_s + 1.5


@pytest.mark.parametrize("path", ["/gzip-bomb", "/double-bomb", "/endless", "/huge-declared"])
def test_worker_cuts_bombs_and_endless_bodies_at_the_cap(hostile: str, worker: Fetcher, path: str) -> None:
    outcome, elapsed, peak = measured(lambda: worker.fetch(hostile + path))
    assert isinstance(outcome, PermanentError) and outcome.reason == "too_large", outcome
    assert elapsed < 2.0
    assert peak < 4 * MB, f"peak {peak} bytes"
    assert worker.fetch(hostile + "/page").body == b"<html>ok</html>"  # and it still works
