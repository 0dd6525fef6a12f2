"""The address guard against a table of hostile hosts, on both of urllib3's paths
(shared/http/urllib3_compat.py): the tests that connect run once with its private connect hook and
once with the public fallback.

Nothing here may reach beyond loopback: names resolve through `FakeDNS`, and every socket is
opened by `LoopbackOnly` (on the private path) and watched by `ConnectWatch` (on both), which
refuse any other address, so a guard bug fails the test instead of sending traffic. A `Canary`
listener on 127.0.0.1 counts the connections it accepts: zero while the guard is on, more once
its address is allowlisted.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import quote, unquote

import pytest
import requests
from urllib3.util.connection import create_connection

from producer.fetch import HttpFetcher
from producer.sitemaps import SitemapReader
from shared.errors import BlockedAddress, ConfigError
from shared.http import urllib3_compat
from shared.http.netguard import check_url, guarded_session, system_resolver
from shared.settings import Settings
from shared.urls import InvalidURL
from worker.fetch.fetcher import Fetcher

PUBLIC = "93.184.216.34"  # judged, never connected to: LoopbackOnly refuses it
GUARD_ON = Settings()
LOOPBACK_ALLOWED = dataclasses.replace(GUARD_ON, fetch_allowlist="127.0.0.0/8")


class FakeDNS:
    """Names -> successive answers (the last repeats); records every question."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        answers = self.answers[host]
        return answers[min(self.asked.count(host), len(answers)) - 1]


def fake_dns() -> FakeDNS:
    return FakeDNS(
        {
            "public.test": [[PUBLIC]],
            "site.test": [["127.0.0.1"]],
            "loop.test": [["127.0.0.1"]],
            "internal.test": [["10.0.0.5"]],
            "metadata.test": [["169.254.169.254"]],
            "v6loop.test": [["::1"]],
            "mapped.test": [["::ffff:127.0.0.1"]],
            "mixed.test": [[PUBLIC, "127.0.0.1"]],  # one bad answer spoils the name
            "nonsense.test": [["not-an-address"]],
            "rebind.test": [[PUBLIC], ["127.0.0.1"]],  # public when checked, loopback after
        }
    )


class OffLoopback(Exception):
    """A test was about to connect beyond loopback: the guard let something through."""


class LoopbackOnly:
    """The socket opener for tests: loopback addresses only, and a record of each one."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, int]] = []

    def __call__(self, address: tuple[str, int], *args: Any) -> socket.socket:
        if not ipaddress.ip_address(address[0].partition("%")[0]).is_loopback:
            raise OffLoopback(address)
        self.opened.append(address)
        return create_connection(address, *args)


class ConnectWatch:
    """The addresses this process connects sockets to while a watch is on (Python's
    'socket.connect' audit event, raised whoever opens the socket), refusing any beyond
    loopback. An audit hook cannot be removed: one is added, and does nothing between tests."""

    current: ClassVar[ConnectWatch | None] = None
    hooked: ClassVar[bool] = False

    def __init__(self) -> None:
        self.connected: list[tuple[str, int]] = []
        if not ConnectWatch.hooked:
            sys.addaudithook(ConnectWatch._on_event)
            ConnectWatch.hooked = True

    @staticmethod
    def _on_event(event: str, args: tuple[Any, ...]) -> None:
        watch = ConnectWatch.current
        if watch is None or event != "socket.connect" or not isinstance(args[1], tuple):
            return
        host, port = str(args[1][0]).partition("%")[0], args[1][1]
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise OffLoopback(args[1])
        watch.connected.append((host, port))


@pytest.fixture(autouse=True)
def watch() -> Iterator[ConnectWatch]:
    made = ConnectWatch()
    ConnectWatch.current = made
    yield made
    ConnectWatch.current = None


@pytest.fixture(params=[True, False], ids=["private_api", "public_api"])
def private_api(request: pytest.FixtureRequest) -> bool:
    """Both of urllib3's paths; the private one must be the one in use where it is wanted."""
    wanted: bool = request.param
    if wanted:
        assert urllib3_compat.private_path_checked() is None
    return wanted


class Canary:
    """A listener that counts accepted connections and answers each with a small HTML 200."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.bind((host, 0))
        self._listener.listen(16)
        self._listener.settimeout(0.01)
        self.port = self._listener.getsockname()[1]
        self._accepted = 0
        self._rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._rounds += 1
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._accepted += 1
            with conn:
                conn.settimeout(1.0)
                try:
                    conn.recv(65536)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n"
                        b"Connection: close\r\n\r\nok"
                    )
                except OSError:
                    pass

    def accepted(self) -> int:
        # A connection made before this call waits in the backlog: two more accept rounds
        # are sure to have counted it.
        start = self._rounds
        while self._rounds < start + 2:
            time.sleep(0.002)
        return self._accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._listener.close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    made = Canary()
    yield made
    made.close()


def session(
    settings: Settings, dns: FakeDNS, opener: LoopbackOnly, private_api: bool = True
) -> requests.Session:
    return guarded_session(settings, resolver=dns, open_socket=opener, private_api=private_api)


# Hosts refused with the guard on: (host as written in the URL, words the refusal must contain).
# Loopback spellings point at the canary; the others are never connected to at all.
BLOCKED_HOSTS = [
    ("127.0.0.1", "loopback"),
    ("127.1", "loopback"),
    ("127.0.1", "loopback"),
    ("2130706433", "loopback"),
    ("0x7f000001", "loopback"),
    ("0X7F.0.0.1", "loopback"),
    ("0177.0.0.1", "loopback"),
    ("017700000001", "loopback"),
    ("127.0.0.1.", "loopback"),
    ("127.255.255.254", "loopback"),
    ("localhost.", "is loopback"),  # the real resolver: /etc/hosts, no network
    ("0.0.0.0", "unspecified"),
    ("0", "unspecified"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("169.254.169.254", "link-local"),
    ("2852039166", "link-local"),  # 169.254.169.254 as one number
    ("192.0.0.8", "IETF"),
    ("192.0.2.1", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("[::1]", "loopback"),
    ("[0:0:0:0:0:0:0:1]", "loopback"),
    ("[::]", "unspecified"),
    ("[::ffff:127.0.0.1]", "loopback, as IPv4 127.0.0.1"),
    ("[::ffff:7f00:1]", "loopback, as IPv4 127.0.0.1"),
    ("[::ffff:169.254.169.254]", "link-local"),
    ("[::127.0.0.1]", "outside 2000::/3"),  # IPv4-compatible (deprecated)
    ("[64:ff9b::127.0.0.1]", "loopback, as IPv4 127.0.0.1"),  # NAT64
    ("[64:ff9b:1::a00:1]", "local-use NAT64"),
    ("[2002:7f00:1::]", "loopback, as IPv4 127.0.0.1"),  # 6to4
    ("[2002:a9fe:a9fe::1]", "as IPv4 169.254.169.254"),
    ("[fe80::1]", "link-local"),
    ("[fe80::1%25eth0]", "link-local"),
    ("[fc00::1]", "unique local"),
    ("[fd12:3456::1]", "unique local"),
    ("[fec0::1]", "site-local"),
    ("[ff02::1]", "multicast"),
    ("[100::1]", "outside 2000::/3"),
    ("[2001::1]", "Teredo"),
    ("[2001:db8::1]", "documentation"),
    ("loop.test", "loop.test -> 127.0.0.1 is loopback"),
    ("internal.test", "10.0.0.5 is private"),
    ("metadata.test", "169.254.169.254 is link-local"),
    ("v6loop.test", "::1 is loopback"),
    ("mapped.test", "loopback, as IPv4 127.0.0.1"),
    ("mixed.test", "127.0.0.1 is loopback"),
    ("nonsense.test", "not an address"),
]
NAMES = set(fake_dns().answers)


@pytest.mark.parametrize(("host", "why"), BLOCKED_HOSTS)
def test_blocked_host_is_refused_before_any_socket_opens(
    host: str, why: str, canary: Canary, watch: ConnectWatch, private_api: bool
) -> None:
    url = f"http://{host}:{canary.port}/page"
    opener = LoopbackOnly()
    resolver = system_resolver if host == "localhost." else fake_dns()
    guarded = guarded_session(GUARD_ON, resolver=resolver, open_socket=opener, private_api=private_api)
    with pytest.raises(BlockedAddress) as refused:
        guarded.get(url, timeout=2)
    assert why in refused.value.detail
    assert refused.value.reason == "blocked_address"
    if host not in NAMES:  # an address (or localhost) in the URL is refused before any request
        with pytest.raises(BlockedAddress, match=re.escape(why)):
            check_url(GUARD_ON)(url)
    assert opener.opened == [] and watch.connected == []
    assert canary.accepted() == 0


@pytest.mark.parametrize("host", ["256.0.0.1", "1.2.3.4.5", "08.0.0.1", "0x100000000", "example.1"])
def test_numeric_host_that_is_no_address_is_invalid(host: str) -> None:
    with pytest.raises(InvalidURL):
        check_url(GUARD_ON)(f"http://{host}/")
    with pytest.raises(InvalidURL):
        session(GUARD_ON, fake_dns(), LoopbackOnly()).get(f"http://{host}/", timeout=2)


# Hosts the guard lets through: (host, FETCH_ALLOWLIST). Judged only; nothing connects.
ALLOWED_HOSTS = [
    ("8.8.8.8", ""),
    ("134744072", ""),  # 8.8.8.8 as one number
    ("100.63.255.255", ""),  # just below carrier-grade NAT
    ("100.128.0.0", ""),  # just above it
    ("172.32.0.1", ""),
    ("169.253.255.255", ""),
    ("[2606:4700:4700::1111]", ""),
    ("[::ffff:8.8.8.8]", ""),
    ("[64:ff9b::808:808]", ""),  # NAT64 of a public address
    ("[2002:808:808::1]", ""),  # 6to4 of a public address
    ("public.test", ""),
    ("127.0.0.1", "127.0.0.0/8"),
    ("0x7f000001", "127.0.0.0/8"),
    ("[::ffff:127.0.0.1]", "127.0.0.0/8"),
    ("internal.test", "10.0.0.0/8"),
    ("internal.test", "internal.test"),
    ("loop.test", ".test"),
    ("[fd12:3456::1]", "fd00::/8"),
]


@pytest.mark.parametrize(("host", "allowlist"), ALLOWED_HOSTS)
def test_allowed_host_passes(host: str, allowlist: str) -> None:
    settings = dataclasses.replace(GUARD_ON, fetch_allowlist=allowlist)
    check_url(settings, resolver=fake_dns())(f"http://{host}/")
    check_url(settings)(f"https://{host}:8443/")


def test_guard_off_lets_everything_through() -> None:
    settings = dataclasses.replace(GUARD_ON, block_private_addresses=False)
    for host, _ in BLOCKED_HOSTS[:-1]:
        if host != "localhost.":
            check_url(settings, resolver=fake_dns())(f"http://{host}/")


def test_allowlisted_loopback_reaches_the_canary(
    canary: Canary, watch: ConnectWatch, private_api: bool
) -> None:
    opener = LoopbackOnly()
    with session(LOOPBACK_ALLOWED, fake_dns(), opener, private_api) as allowed:
        for host in ("127.0.0.1", "2130706433", "0x7f000001", "127.1", "loop.test"):
            response = allowed.get(f"http://{host}:{canary.port}/", timeout=2)
            assert response.text == "ok"
    assert canary.accepted() == 5
    assert watch.connected == [("127.0.0.1", canary.port)] * 5
    assert len(opener.opened) == (5 if private_api else 0)


def test_https_is_guarded_too(canary: Canary, private_api: bool) -> None:
    for url in (f"https://127.0.0.1:{canary.port}/", f"https://loop.test:{canary.port}/"):
        with pytest.raises(BlockedAddress):
            session(GUARD_ON, fake_dns(), LoopbackOnly(), private_api).get(url, timeout=2)
        assert canary.accepted() == 0
    allowed = session(LOOPBACK_ALLOWED, fake_dns(), LoopbackOnly(), private_api)
    with pytest.raises(requests.exceptions.SSLError):  # the canary speaks no TLS, but was reached
        allowed.get(f"https://loop.test:{canary.port}/", timeout=2)
    assert canary.accepted() == 1


def test_ipv6_loopback_canary_sees_nothing(private_api: bool) -> None:
    try:
        canary = Canary("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        with pytest.raises(BlockedAddress):
            guarded = session(GUARD_ON, fake_dns(), LoopbackOnly(), private_api)
            guarded.get(f"http://[::1]:{canary.port}/", timeout=2)
        assert canary.accepted() == 0
        allowed = session(
            dataclasses.replace(GUARD_ON, fetch_allowlist="::1"), fake_dns(), LoopbackOnly(), private_api
        )
        assert allowed.get(f"http://v6loop.test:{canary.port}/").text == "ok"
        assert canary.accepted() == 1
    finally:
        canary.close()


def test_dns_rebinding_is_caught_at_connect(canary: Canary, watch: ConnectWatch, private_api: bool) -> None:
    dns, opener = fake_dns(), LoopbackOnly()
    url = f"http://rebind.test:{canary.port}/"
    check_url(GUARD_ON, resolver=dns)(url)  # first answer: public, so the early check passes
    with pytest.raises(BlockedAddress, match=re.escape("127.0.0.1 is loopback")):
        session(GUARD_ON, dns, opener, private_api).get(url, timeout=2)
    assert dns.asked == ["rebind.test", "rebind.test"]
    assert opener.opened == [] and watch.connected == []
    assert canary.accepted() == 0


def test_the_connection_goes_to_the_address_that_was_checked(
    canary: Canary, watch: ConnectWatch, private_api: bool
) -> None:
    # Answers flip from allowed loopback to a blocked private address: one question per
    # connection means the flip cannot land between the check and the connect.
    dns = FakeDNS({"flip.test": [["127.0.0.1"], ["10.0.0.1"]]})
    opener = LoopbackOnly()
    guarded = session(LOOPBACK_ALLOWED, dns, opener, private_api)
    response = guarded.get(f"http://flip.test:{canary.port}/", timeout=2)
    assert response.text == "ok"
    assert dns.asked == ["flip.test"]
    assert watch.connected == [("127.0.0.1", canary.port)]


class RedirectHandler(BaseHTTPRequestHandler):
    """GET /to/<quoted url> answers 302 with that Location, other paths the page of that name
    (404 when there is none); the Host header of each request is kept."""

    hosts: ClassVar[list[str]] = []
    pages: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        self.hosts.append(self.headers.get("Host", ""))
        page = self.pages.get(self.path)
        self.send_response(302 if self.path.startswith("/to/") else 200 if page else 404)
        if self.path.startswith("/to/"):
            self.send_header("Location", unquote(self.path.removeprefix("/to/")))
        self.send_header("Content-Length", str(len(page or b"")))
        self.end_headers()
        self.wfile.write(page or b"")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def redirector() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RedirectHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


REDIRECT_TARGETS = [
    "http://127.0.0.1:{port}/",
    "http://0x7f000001:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/",
    "http://loop.test:{port}/",  # a name: refused where the connection is made
    "http://internal.test:{port}/",
    "http://169.254.169.254/latest/meta-data/",
]


@pytest.mark.parametrize("target", REDIRECT_TARGETS)
def test_redirect_to_a_blocked_address_is_refused(
    target: str, redirector: int, canary: Canary, watch: ConnectWatch, private_api: bool
) -> None:
    # site.test is allowed by name; the hop it redirects to is not.
    settings = dataclasses.replace(GUARD_ON, fetch_allowlist="site.test", max_redirects=3)
    url = f"http://site.test:{redirector}/to/{quote(target.format(port=canary.port), safe='')}"
    opener = LoopbackOnly()
    with pytest.raises(BlockedAddress):  # requests following the redirect itself
        session(settings, fake_dns(), opener, private_api).get(url, timeout=2)
    worker = Fetcher(
        settings,
        session_factory=lambda: session(settings, fake_dns(), opener, private_api),
        check_url=check_url(settings),
    )
    with worker, pytest.raises(BlockedAddress) as refused:  # the worker, checking each hop
        worker.fetch(url)
    assert refused.value.reason == "blocked_address"
    assert canary.accepted() == 0
    assert set(watch.connected) == {("127.0.0.1", redirector)}  # the redirector only
    assert RedirectHandler.hosts[-1] == f"site.test:{redirector}"  # Host header: the name


def test_a_proxied_request_has_its_target_judged(canary: Canary, private_api: bool) -> None:
    proxy = {"http": f"http://127.0.0.1:{canary.port}"}  # the canary plays the proxy
    guarded = session(LOOPBACK_ALLOWED, fake_dns(), LoopbackOnly(), private_api)
    with pytest.raises(BlockedAddress, match=re.escape("10.0.0.5 is private")):
        guarded.get("http://internal.test/", proxies=proxy, timeout=2)
    assert canary.accepted() == 0
    assert guarded.get("http://public.test/", proxies=proxy, timeout=2).text == "ok"
    assert canary.accepted() == 1


def test_allowlist_is_validated_when_settings_load() -> None:
    good = Settings.from_env({"FETCH_ALLOWLIST": "10.0.0.0/8, intranet.test, .corp.test, ::1, 127.0.0.1"})
    assert good.fetch_allowlist
    for bad in ("10.0.0.0/33", "999.1.1.1", "exa mple.test", "http://x.test", "127.1", "fe80::/129"):
        with pytest.raises(ConfigError, match=f"FETCH_ALLOWLIST: '{bad}'"):
            Settings.from_env({"FETCH_ALLOWLIST": f"10.0.0.0/8,{bad}"})
    with pytest.raises(ConfigError, match="BLOCK_PRIVATE_ADDRESSES"):
        Settings.from_env({"BLOCK_PRIVATE_ADDRESSES": "maybe"})


def test_producer_records_blocked_sitemaps_and_goes_on(redirector: int, canary: Canary) -> None:
    site, blocked = f"http://site.test:{redirector}", f"{canary.port}"
    children = [
        f"{site}/good.xml",
        f"http://127.0.0.1:{blocked}/a.xml",
        f"http://loop.test:{blocked}/b.xml",
        f"{site}/to/{quote(f'http://0x7f000001:{blocked}/c.xml', safe='')}",
        "http://metadata.test/latest/sitemap.xml",
    ]
    ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
    listed = "".join(f"<sitemap><loc>{child}</loc></sitemap>" for child in children)
    RedirectHandler.pages.update(
        {
            "/index.xml": f"<sitemapindex {ns}>{listed}</sitemapindex>".encode(),
            "/good.xml": f"<urlset {ns}><url><loc>http://example.com/1</loc></url></urlset>".encode(),
        }
    )
    settings = dataclasses.replace(GUARD_ON, fetch_allowlist="site.test")
    opener = LoopbackOnly()

    def sessions(settings: Settings) -> requests.Session:
        return guarded_session(settings, resolver=fake_dns(), open_socket=opener)

    with HttpFetcher(settings, sessions) as fetch:
        reader = SitemapReader(fetch, max_depth=2, max_bytes=1_000_000)
        urls = [e.url for e in reader.read(f"{site}/index.xml")]
        urls += [e.url for e in reader.read_site(f"http://loop.test:{blocked}/")]
    assert urls == ["http://example.com/1"]
    assert [f.url for f in reader.failures] == [*children[1:], f"http://loop.test:{blocked}/sitemap.xml"]
    assert all(f.error.startswith("blocked_address: ") for f in reader.failures), reader.failures
    assert canary.accepted() == 0
