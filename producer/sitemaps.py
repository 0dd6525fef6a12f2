"""Reading sitemaps: XML urlsets and indexes, gzip, plain text, and robots.txt `Sitemap:` lines.

Sitemaps come from strangers, so:
  * the byte cap applies to DECOMPRESSED bytes (a small gzip can inflate to gigabytes);
  * XML is parsed by defusedxml with DTDs forbidden (no entity expansion, no external files);
  * parsing streams: each <url> is handed on and dropped, so a 50,000-URL file never sits in
    memory as a tree;
  * indexes nest only to a bounded depth and each sitemap is read once per run;
  * one broken sitemap is recorded with a one-line reason and the others go on.
"""

from __future__ import annotations

import gzip
import io
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urljoin
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree
from protego import Protego

from producer.fetch import Fetch, FetchFailed
from shared.urls import InvalidURL, canonicalize

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
READ_CHUNK_BYTES = 64 * 1024
MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 lets a crawler stop reading robots.txt past 500 KiB
CHANGEFREQS = frozenset({"always", "hourly", "daily", "weekly", "monthly", "yearly", "never"})
MAX_LASTMOD_CHARS = 64


@dataclass(frozen=True)
class SitemapEntry:
    """A URL as a sitemap or URL file gave it (not yet canonical) with its hints."""

    url: str
    source: str
    lastmod: str | None = None
    priority: float | None = None
    changefreq: str | None = None


@dataclass(frozen=True)
class ChildSitemap:
    """A <sitemap><loc> of a sitemap index."""

    url: str


@dataclass(frozen=True)
class SitemapFailure:
    url: str
    error: str


class SitemapError(Exception):
    """Why one sitemap document cannot be (fully) read; `str()` is one line."""


@dataclass
class SitemapReader:
    """Reads sitemaps through an injected `fetch`, remembering what it read and what failed."""

    fetch: Fetch
    max_depth: int
    max_bytes: int
    sitemaps_read: int = 0
    failures: list[SitemapFailure] = field(default_factory=list)
    _visited: set[str] = field(default_factory=set)

    def read_site(self, root_url: str) -> Iterator[SitemapEntry]:
        """Every URL in the sitemaps that a site's robots.txt lists, else in /sitemap.xml."""
        for sitemap_url in self.sitemaps_of_site(root_url):
            yield from self.read(sitemap_url)

    def sitemaps_of_site(self, root_url: str) -> list[str]:
        robots_url = urljoin(root_url, "/robots.txt")
        try:
            text = self.fetch(robots_url)[:MAX_ROBOTS_BYTES].decode("utf-8", "replace")
            listed = [urljoin(robots_url, s.strip()) for s in Protego.parse(text).sitemaps]
        except FetchFailed as exc:
            log.info("no robots.txt at %s (%s): trying /sitemap.xml", robots_url, exc)
            listed = []
        if listed:
            log.info("robots.txt at %s lists %d sitemaps", robots_url, len(listed))
            return listed
        return [urljoin(root_url, "/sitemap.xml")]

    def read(self, sitemap_url: str, depth: int = 0) -> Iterator[SitemapEntry]:
        """Every URL of a sitemap, following an index into its children (depth-first)."""
        try:
            key = canonicalize(sitemap_url)
        except InvalidURL as exc:
            self._fail(sitemap_url, str(exc))
            return
        if key in self._visited:
            log.debug("sitemap %s already read in this run", sitemap_url)
            return
        self._visited.add(key)
        if depth > self.max_depth:
            self._fail(sitemap_url, f"sitemap indexes nested deeper than {self.max_depth}")
            return
        try:
            body = self.fetch(sitemap_url)
        except FetchFailed as exc:
            self._fail(sitemap_url, str(exc))
            return
        urls = children = 0
        try:
            for item in parse_sitemap(body, sitemap_url, self.max_bytes):
                if isinstance(item, ChildSitemap):
                    children += 1
                    yield from self.read(urljoin(sitemap_url, item.url), depth + 1)
                else:
                    urls += 1
                    yield item
        except SitemapError as exc:
            self._fail(sitemap_url, f"{exc} (after {urls} URLs)" if urls else str(exc))
            return
        self.sitemaps_read += 1
        log.info("read sitemap %s: %d URLs, %d child sitemaps", sitemap_url, urls, children)

    def _fail(self, url: str, error: str) -> None:
        log.warning("sitemap %s failed: %s", url, error)
        self.failures.append(SitemapFailure(url, error))


def parse_sitemap(body: bytes, source: str, max_bytes: int) -> Iterator[SitemapEntry | ChildSitemap]:
    """Entries of a urlset, children of an index, or lines of a plain-text sitemap.

    gzip is recognised by its magic bytes, not by name: servers and names both lie.
    Raises SitemapError once the document turns out broken; what came before stays yielded.
    """
    stream = _CappedReader(body, max_bytes)
    if stream.first_meaningful_byte() == b"<":
        yield from _parse_xml(stream, source)
    else:
        yield from _parse_text(stream, source)


class _CappedReader:
    """A file-like view of a (possibly gzip) body that refuses to yield more than `max_bytes`
    decompressed bytes, decompressing only as far as it is read."""

    def __init__(self, body: bytes, max_bytes: int) -> None:
        raw = io.BytesIO(body)
        self._inner: gzip.GzipFile | io.BytesIO = raw
        if body[:2] == GZIP_MAGIC:
            self._inner = gzip.GzipFile(fileobj=raw)
        self._max_bytes = max_bytes
        self._total = 0
        self._peeked = b""

    def read(self, size: int = -1) -> bytes:
        if self._peeked:
            data, self._peeked = self._peeked, b""
            return data
        try:
            data = self._inner.read(size if size > 0 else READ_CHUNK_BYTES)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise SitemapError(f"bad gzip data ({exc.__class__.__name__})") from None
        self._total += len(data)
        if self._total > self._max_bytes:
            raise SitemapError(f"larger than {self._max_bytes} bytes uncompressed")
        return data

    def first_meaningful_byte(self) -> bytes:
        """The first byte after any BOM and whitespace, keeping what was read for `read`."""
        head = b""
        while True:
            chunk = self.read(READ_CHUNK_BYTES)
            head += chunk
            stripped = head.removeprefix(b"\xef\xbb\xbf").lstrip()
            if stripped or not chunk:
                self._peeked = head
                return stripped[:1]


def _parse_text(stream: _CappedReader, source: str) -> Iterator[SitemapEntry]:
    rest = b""
    while True:
        chunk = stream.read(READ_CHUNK_BYTES)
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop() if chunk else b""
        for raw in lines:
            line = raw.decode("utf-8", "replace").lstrip("\ufeff").strip()
            if line and not line.startswith("#"):
                yield SitemapEntry(url=line, source=source)
        if not chunk:
            return


def _parse_xml(stream: _CappedReader, source: str) -> Iterator[SitemapEntry | ChildSitemap]:
    events = defusedxml.ElementTree.iterparse(
        stream,
        events=("start", "end"),
        forbid_dtd=True,
        forbid_entities=True,
        forbid_external=True,
    )
    root: Element | None = None
    kind = ""
    depth = 0
    try:
        for event, elem in events:
            if event == "start":
                depth += 1
                if root is None:
                    root, kind = elem, _localname(elem.tag)
                    if kind not in ("urlset", "sitemapindex"):
                        raise SitemapError(f"not a sitemap (root element <{kind[:40]}>)")
                continue
            depth -= 1
            if depth != 1 or root is None:
                continue  # only direct children of the root are entries
            item = _entry(elem, kind, source)
            if item is not None:
                yield item
            root.clear()  # drop what was handed on, so memory stays flat
    except ParseError as exc:
        raise SitemapError(f"bad XML: {exc}") from None
    except defusedxml.DTDForbidden:
        raise SitemapError("XML with a DTD refused (entity expansion risk)") from None
    except defusedxml.DefusedXmlException as exc:
        raise SitemapError(f"XML refused: {exc.__class__.__name__}") from None
    if root is None:
        raise SitemapError("empty document")


def _entry(elem: Element, kind: str, source: str) -> SitemapEntry | ChildSitemap | None:
    name = _localname(elem.tag)
    fields = {_localname(child.tag): (child.text or "").strip() for child in elem}
    loc = fields.get("loc")
    if not loc:
        return None
    if kind == "sitemapindex" and name == "sitemap":
        return ChildSitemap(loc)
    if kind == "urlset" and name == "url":
        changefreq = fields.get("changefreq", "").lower()
        return SitemapEntry(
            url=loc,
            source=source,
            lastmod=fields.get("lastmod", "")[:MAX_LASTMOD_CHARS] or None,
            priority=_priority(fields.get("priority", "")),
            changefreq=changefreq if changefreq in CHANGEFREQS else None,
        )
    return None


def _localname(tag: str) -> str:
    """'{http://www.sitemaps.org/schemas/sitemap/0.9}loc' -> 'loc': sitemaps in the wild use
    several namespaces (or none), so only the local name counts."""
    return tag.rpartition("}")[2]


def _priority(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None
