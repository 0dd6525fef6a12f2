"""Properties over generated input: URL canonicalisation, the address guard, the sitemap parser.

Runs are bounded (200 examples, derandomized) so the suite stays fast and repeatable; raise
`max_examples` locally to search harder.
"""

from __future__ import annotations

import gzip
import ipaddress
import zlib

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from producer.fetch import FetchFailed
from producer.sitemaps import SitemapError, SitemapReader, parse_sitemap
from shared.errors import BlockedAddress
from shared.http.addresses import AddressPolicy, blocked_reason
from shared.http.netguard import AddressGuard
from shared.urls import InvalidURL, canonicalize

bounded = hypothesis_settings(max_examples=200, deadline=None, database=None, derandomize=True)

BLOCKED_IPV4_NETWORKS = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
]
BLOCKED_IPV6_NETWORKS = ["::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "2001:db8::/32", "64:ff9b:1::/48"]
PUBLIC = "93.184.216.34"
PRIVATE_NAMES = {"intranet.test": "10.0.0.1", "metadata.test": "169.254.169.254"}


def resolver(host: str, port: int) -> list[str]:
    """Two names are private; every other name resolves to a public address."""
    return [PRIVATE_NAMES.get(host, PUBLIC)]


GUARD = AddressGuard(AddressPolicy(), resolver)


def spell_ipv4(address: ipaddress.IPv4Address, style: int, upper: bool, root_dot: bool) -> str:
    """One of the spellings resolvers accept for an IPv4 address."""
    value, octets = int(address), address.packed
    spellings = [
        str(address),
        str(value),  # 2130706433
        hex(value),  # 0x7f000001
        ".".join(f"0{b:o}" for b in octets),  # 0177.0.0.01
        ".".join(hex(b) for b in octets),  # 0x7f.0x0.0x0.0x1
        f"{octets[0]}.{value & 0xFFFFFF}",  # 127.1
        f"{octets[0]}.{octets[1]}.{value & 0xFFFF}",  # 127.0.1
        f"{hex(octets[0])}.{octets[1]:o}.{octets[2]}.{octets[3]}",  # mixed bases
    ]
    spelled = spellings[style % len(spellings)]
    if style % len(spellings) == 7 and octets[1] > 7:
        spelled = spelled.replace(f".{octets[1]:o}.", f".0{octets[1]:o}.", 1)  # octal needs its 0
    spelled = spelled.upper() if upper else spelled
    return spelled + "." if root_dot else spelled


blocked_ipv4 = st.sampled_from(BLOCKED_IPV4_NETWORKS).flatmap(lambda net: st.ip_addresses(network=net))
blocked_ipv6 = st.one_of(
    st.sampled_from(BLOCKED_IPV6_NETWORKS).flatmap(lambda net: st.ip_addresses(network=net)),
    blocked_ipv4.map(lambda a: ipaddress.IPv6Address(f"::ffff:{a}")),
    blocked_ipv4.map(lambda a: ipaddress.IPv6Address(int(ipaddress.IPv6Address("2002::")) | int(a) << 80)),
)
blocked_hosts = st.one_of(
    st.builds(spell_ipv4, blocked_ipv4, st.integers(0, 7), st.booleans(), st.booleans()),
    blocked_ipv6.map(lambda a: f"[{a.exploded if int(a) % 2 else a.compressed}]"),
    st.sampled_from(sorted(PRIVATE_NAMES)).map(lambda n: n.upper() if len(n) % 2 else n + "."),
    st.sampled_from(["localhost", "LOCALHOST.", "127.0.0.1", "[::1]"]),
)
any_hosts = st.one_of(
    blocked_hosts,
    st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a)),
    st.from_regex(r"[a-zA-Z0-9-]{1,12}(\.[a-zA-Z0-9-]{1,8}){0,3}\.?", fullmatch=True),
    st.text(min_size=1, max_size=20),
    # digits and dots, some of them full-width or ideographic, which IDNA turns into ASCII
    st.text(alphabet="0123456789.xXabcdef\uff10\uff11\uff12\uff17\uff0e\u3002", min_size=1, max_size=16),
)
url_parts = st.text(alphabet="abcAZ09-._~%/?#&=+:;@[] \t\u00e9\u3002", max_size=30)
urls = st.builds(
    lambda scheme, host, port, rest: f"{scheme}://{host}{port}/{rest}",
    st.sampled_from(["http", "https", "HTTP", "ftp"]),
    any_hosts,
    st.sampled_from(["", ":80", ":443", ":8080", ":0", ":99999", ":x"]),
    url_parts,
)
any_text = st.one_of(urls, st.text(max_size=60))


@bounded
@given(any_text)
def test_canonicalize_raises_nothing_but_invalid_url_and_is_idempotent(text: str) -> None:
    try:
        canonical = canonicalize(text)
    except InvalidURL:
        return
    assert canonicalize(canonical) == canonical


@bounded
@given(blocked_hosts, st.sampled_from(["http", "https"]))
def test_every_spelling_of_a_blocked_address_is_blocked(host: str, scheme: str) -> None:
    with pytest.raises(BlockedAddress):
        GUARD.check_url(f"{scheme}://{host}/", resolve=True)


@bounded
@given(st.ip_addresses(v=4), st.integers(0, 7), st.booleans(), st.booleans())
def test_ipv4_spellings_canonicalize_to_the_dotted_quad(
    address: ipaddress.IPv4Address, style: int, upper: bool, root_dot: bool
) -> None:
    host = spell_ipv4(address, style, upper, root_dot)
    assert canonicalize(f"http://{host}/x") == f"http://{address}/x"
    blocked = blocked_reason(address) is not None
    try:
        GUARD.check_url(f"http://{host}/x")
    except BlockedAddress:
        assert blocked
    else:
        assert not blocked


def verdict(url: str) -> str:
    try:
        GUARD.check_url(url, resolve=True)
    except BlockedAddress:
        return "blocked"
    except InvalidURL:
        return "invalid"
    return "allowed"


@bounded
@given(urls)
def test_canonicalize_never_turns_a_blocked_url_into_an_allowed_one(url: str) -> None:
    # Stronger than the title: the guard judges a URL and its canonical form alike.
    try:
        canonical = canonicalize(url)
    except InvalidURL:
        return  # refused before the guard is asked
    assert verdict(canonical) == verdict(url)


XML_PIECES = [
    b"<urlset>",
    b"</urlset>",
    b"<sitemapindex>",
    b"</sitemapindex>",
    b"<url>",
    b"</url>",
    b"<sitemap>",
    b"</sitemap>",
    b"<loc>",
    b"</loc>",
    b"<priority>",
    b"</priority>",
    b"http://a.test/",
    b"http://[oops",
    b"<?xml version='1.0' encoding='utf-16'?>",
    b"<?xml version='1.0' encoding='nope'?>",
    b'<!DOCTYPE urlset [<!ENTITY e "x">]>',
    b"&e;",
    b"&#0;",
    b"&amp;",
    b"<![CDATA[",
    b"]]>",
    b"<!--",
    b"-->",
    b"\xef\xbb\xbf",
    b"\x1f\x8b",
    b"\x00",
    b"\n",
    b" ",
    b"<a>" * 40,
]
xml_like = st.lists(st.one_of(st.sampled_from(XML_PIECES), st.binary(max_size=8)), max_size=30).map(b"".join)
documents = st.one_of(
    st.binary(max_size=300),
    xml_like,
    xml_like.map(gzip.compress),
    xml_like.map(lambda d: gzip.compress(d)[: max(2, len(d) // 2)]),  # cut short
    xml_like.map(zlib.compress),
)


@bounded
@given(documents, st.integers(1, 4000))
def test_sitemap_parser_raises_nothing_but_sitemap_error(document: bytes, max_bytes: int) -> None:
    try:
        for item in parse_sitemap(document, "http://s.test/sitemap.xml", max_bytes):
            assert item.url
    except SitemapError:
        pass


@bounded
@given(documents, documents)
def test_sitemap_reader_never_raises(sitemap: bytes, robots: bytes) -> None:
    def fetch(url: str) -> bytes:
        if url.endswith("/missing.xml"):
            raise FetchFailed("HTTP 404", 404)
        return robots if url.endswith("/robots.txt") else sitemap

    reader = SitemapReader(fetch, max_depth=2, max_bytes=4000)
    list(reader.read_site("http://s.test/"))
    list(reader.read("http://s.test/missing.xml"))
    assert reader.failures[-1].error == "HTTP 404"
