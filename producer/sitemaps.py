"""Reading sitemaps: XML urlsets and indexes, RSS and Atom feeds (producer/feeds.py), gzip,
plain text, and robots.txt `Sitemap:` lines.

Sitemaps come from strangers, so:
  * the byte cap applies to DECOMPRESSED bytes (a small gzip can inflate to gigabytes);
  * XML (producer/sitemap_xml.py) is parsed by defusedxml with DTDs forbidden (no entity
    expansion, no external files);
  * parsing streams and builds no tree: each entry's fields are picked out of expat's events
    and handed on, everything else is skipped as it goes by, and nesting and the bytes of one
    tag are bounded, so no document costs much more memory than one entry;
  * indexes nest only to a bounded depth and each sitemap is read once per run;
  * one broken sitemap is recorded with a one-line reason and the others go on: on any bytes,
    nothing but SitemapError leaves `parse_sitemap`, and nothing at all leaves SitemapReader;
  * a body with nothing in it (no bytes, whitespace, a lone BOM) or an HTML page (a soft 404)
    is a failed sitemap, not a sitemap without URLs;
  * dates are normalised to UTC ISO 8601 (producer/lastmod.py); one that is no date becomes
    None and is counted among the reader's warnings, as `invalid_lastmod`.
"""

from __future__ import annotations

import collections
import gzip
import io
import logging
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urljoin

from protego import Protego

from producer.fetch import Fetch, FetchFailed
from producer.sitemap_types import ChildSitemap, SitemapEntry, SitemapError, SitemapFailure, join_url
from producer.sitemap_xml import (
    ENTRY_FIELDS,
    MAX_ENTRY_FIELDS,
    NOT_A_SITEMAP_HTML,
    READ_CHUNK_BYTES,
    _entry,
    parse_xml,
)
from shared.urls import InvalidURL, canonicalize

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 lets a crawler stop reading robots.txt past 500 KiB
MAX_TEXT_LINE_BYTES = 16 * 1024  # far past the longest URL we accept
# What an HTML page starts with, after an XML declaration and comments if any: a server's
# "not found" page served with status 200 at a sitemap's URL.
HTML_START = re.compile(
    rb"(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*(?:<!doctype\s+html|<html[\s>/]|<head[\s>]|<body[\s>])",
    re.IGNORECASE | re.DOTALL,
)


@dataclass
class SitemapReader:
    """Reads sitemaps through an injected `fetch`, remembering what it read and what failed."""

    fetch: Fetch
    max_depth: int
    max_bytes: int
    sitemaps_read: int = 0
    failures: list[SitemapFailure] = field(default_factory=list)
    warnings: collections.Counter[str] = field(default_factory=collections.Counter)
    _visited: set[str] = field(default_factory=set)

    def read_site(self, root_url: str) -> Iterator[SitemapEntry]:
        """Every URL in the sitemaps that a site's robots.txt lists, else in /sitemap.xml."""
        for sitemap_url in self.sitemaps_of_site(root_url):
            yield from self.read(sitemap_url)

    def sitemaps_of_site(self, root_url: str) -> list[str]:
        robots_url = urljoin(root_url, "/robots.txt")
        try:
            text = self.fetch(robots_url)[:MAX_ROBOTS_BYTES].decode("utf-8", "replace")
            joined = (join_url(robots_url, s.strip()) for s in Protego.parse(text).sitemaps)
            listed = [url for url in joined if url is not None]
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
        warnings: collections.Counter[str] = collections.Counter()
        try:
            for item in parse_sitemap(body, sitemap_url, self.max_bytes, warnings):
                if isinstance(item, ChildSitemap):
                    children += 1
                    child = join_url(sitemap_url, item.url)
                    if child is None:
                        self._fail(item.url[:200], "invalid_url: cannot be parsed")
                        continue
                    yield from self.read(child, depth + 1)
                else:
                    urls += 1
                    yield item
        except SitemapError as exc:
            self._fail(sitemap_url, f"{exc} (after {urls} URLs)" if urls else str(exc))
            return
        finally:
            self._warn(sitemap_url, warnings)
        self.sitemaps_read += 1
        log.info("read sitemap %s: %d URLs, %d child sitemaps", sitemap_url, urls, children)

    def _warn(self, url: str, warnings: collections.Counter[str]) -> None:
        for what, count in warnings.items():
            log.warning("sitemap %s: %d entries with %s (taken as none)", url, count, what)
        self.warnings.update(warnings)

    def _fail(self, url: str, error: str) -> None:
        log.warning("sitemap %s failed: %s", url, error)
        self.failures.append(SitemapFailure(url, error))


def parse_sitemap(
    body: bytes, source: str, max_bytes: int, warnings: collections.Counter[str] | None = None
) -> Iterator[SitemapEntry | ChildSitemap]:
    """Entries of a urlset or a feed, children of an index, or lines of a plain-text sitemap.

    gzip is recognised by its magic bytes, not by name: servers and names both lie.
    Raises SitemapError once the document turns out broken; what came before stays yielded.
    Adds what was dropped from entries (an `invalid_lastmod`) to `warnings`.
    """
    stream = _CappedReader(body, max_bytes)
    first = stream.first_meaningful_byte()
    if not first:
        raise SitemapError("empty body (nothing but whitespace)")
    if first == b"<":
        if HTML_START.match(stream.peeked()):
            raise SitemapError(NOT_A_SITEMAP_HTML)
        yield from parse_xml(stream, source, collections.Counter() if warnings is None else warnings)
    else:
        yield from _parse_text(stream, source)


class _CappedReader:
    """A file-like view of a (possibly gzip) body that refuses to yield more than `max_bytes`
    decompressed bytes, decompressing only as far as it is read."""

    def __init__(self, body: bytes, max_bytes: int) -> None:
        raw = io.BytesIO(body)
        self._inner: gzip.GzipFile | io.BytesIO = raw
        self._gzipped = body[:2] == GZIP_MAGIC
        if self._gzipped:
            self._inner = gzip.GzipFile(fileobj=raw)
        self._max_bytes = max_bytes
        self._total = 0
        self._peeked = b""
        self.max_bytes_unmarked: int | None = None  # set: bytes allowed between two `mark`s
        self._unmarked = 0

    def read(self, size: int = -1) -> bytes:
        if self._peeked:
            data, self._peeked = self._peeked, b""
        else:
            try:
                data = self._inner.read(size if size > 0 else READ_CHUNK_BYTES)
            except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
                raise SitemapError(f"bad gzip data ({exc.__class__.__name__})") from None
            self._total += len(data)
            if self._total > self._max_bytes:
                raise SitemapError(f"larger than {self._max_bytes} bytes uncompressed")
        self._unmarked += len(data)
        if self.max_bytes_unmarked is not None and self._unmarked > self.max_bytes_unmarked:
            raise SitemapError(f"an XML tag or text longer than {self.max_bytes_unmarked} bytes")
        return data

    def mark(self) -> None:
        self._unmarked = 0

    def first_meaningful_byte(self) -> bytes:
        """The first byte after any BOM and leading whitespace, both dropped; what follows is
        kept for `read`. Whitespace is dropped chunk by chunk: megabytes of it (a cheap gzip
        bomb) must cost one pass, not a pass per chunk."""
        head = b""
        while len(head) < len(UTF8_BOM):
            chunk = self.read(READ_CHUNK_BYTES)
            if not chunk:
                break
            head += chunk
        if self._gzipped and head[:2] == GZIP_MAGIC:
            raise SitemapError("gzip inside gzip refused")
        head = head.removeprefix(UTF8_BOM).lstrip()
        while not head:
            chunk = self.read(READ_CHUNK_BYTES)
            if not chunk:
                break
            head = chunk.lstrip()
        self._peeked = head
        return head[:1]

    def peeked(self) -> bytes:
        """The bytes `first_meaningful_byte` read ahead (at least a chunk, unless the body is
        shorter), not yet returned by `read`."""
        return self._peeked


def _parse_text(stream: _CappedReader, source: str) -> Iterator[SitemapEntry]:
    pending = b""  # the start of a line not yet ended
    overlong = False  # inside a line too long to be a URL: dropped up to its end
    while True:
        chunk = stream.read(READ_CHUNK_BYTES)
        if b"\x00" in chunk:  # no text sitemap holds NUL; binary junk is no list of URLs
            raise SitemapError("binary data, not a sitemap")
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop() if chunk else b""
        if overlong and lines:
            lines, overlong = lines[1:], False
        for raw in lines:
            line = raw.decode("utf-8", "replace").lstrip("\ufeff").strip()
            if line and not line.startswith("#"):
                yield SitemapEntry(url=line, source=source)
        if len(pending) > MAX_TEXT_LINE_BYTES:  # else each chunk would copy it again
            pending, overlong = b"", True
        if not chunk:
            return


__all__ = [
    "ENTRY_FIELDS",
    "MAX_ENTRY_FIELDS",
    "READ_CHUNK_BYTES",
    "ChildSitemap",
    "SitemapEntry",
    "SitemapError",
    "SitemapFailure",
    "SitemapReader",
    "_entry",
    "parse_sitemap",
]
