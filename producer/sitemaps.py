"""Reading sitemaps: XML urlsets and indexes, RSS and Atom feeds (producer/feeds.py), gzip,
plain text, and robots.txt `Sitemap:` lines.

Sitemaps come from strangers, so:
  * the byte cap applies to DECOMPRESSED bytes (a small gzip can inflate to gigabytes);
  * XML is parsed by defusedxml with DTDs forbidden (no entity expansion, no external files);
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
from typing import Any, NoReturn
from urllib.parse import urljoin
from xml.etree.ElementTree import ParseError

import defusedxml
import defusedxml.ElementTree
from protego import Protego

from producer.feeds import FEED_ROOTS, FeedBuilder
from producer.fetch import Fetch, FetchFailed
from producer.lastmod import normalise_lastmod, normalise_rss_date
from shared.urls import InvalidURL, canonicalize

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
READ_CHUNK_BYTES = 64 * 1024
MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 lets a crawler stop reading robots.txt past 500 KiB
CHANGEFREQS = frozenset({"always", "hourly", "daily", "weekly", "monthly", "yearly", "never"})
MAX_LASTMOD_CHARS = 64
ENTRY_FIELDS = frozenset({"loc", "lastmod", "priority", "changefreq"})
MAX_ENTRY_FIELDS = 16  # kept per entry; a <url> holding a million <loc>s keeps only the first
MAX_XML_DEPTH = 32  # sitemaps nest 4 deep, and every open element stays in memory
# The bytes of one tag or text run (between two parser events). expat turns a tag's attributes
# into objects some 30 times their size, so one giant tag must not reach the parser whole.
MAX_XML_TOKEN_BYTES = 256 * 1024
MAX_TEXT_LINE_BYTES = 16 * 1024  # far past the longest URL we accept
# What an HTML page starts with, after an XML declaration and comments if any: a server's
# "not found" page served with status 200 at a sitemap's URL.
HTML_START = re.compile(
    rb"(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*(?:<!doctype\s+html|<html[\s>/]|<head[\s>]|<body[\s>])",
    re.IGNORECASE | re.DOTALL,
)
NOT_A_SITEMAP_HTML = "not a sitemap (HTML page)"
INVALID_LASTMOD = "invalid_lastmod"


@dataclass(slots=True)  # not frozen: made for every URL read, and frozen ones build slowly
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
            joined = (_join(robots_url, s.strip()) for s in Protego.parse(text).sitemaps)
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
                    child = _join(sitemap_url, item.url)
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


def _join(base: str, reference: str) -> str | None:
    """`reference` resolved against `base`, or None when it cannot be parsed ('http://[')."""
    try:
        return urljoin(base, reference)
    except ValueError:
        return None


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
        yield from _parse_xml(stream, source, collections.Counter() if warnings is None else warnings)
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


def _parse_xml(
    stream: _CappedReader, source: str, warnings: collections.Counter[str]
) -> Iterator[SitemapEntry | ChildSitemap]:
    builder = _EntryBuilder(source, warnings)
    parser = defusedxml.ElementTree.XMLParser(
        target=builder, forbid_dtd=True, forbid_entities=True, forbid_external=True
    )
    builder.expat = parser.parser  # a feed's root hands the events over to a FeedBuilder
    # expat calls the builder straight, not through ElementTree's wrappers, which expand every
    # tag name and attribute list into new objects: a sitemap never reads an attribute. The
    # defusing handlers defusedxml set on the same expat parser stay in place.
    parser.parser.StartElementHandler = builder.start
    parser.parser.EndElementHandler = builder.end
    stream.max_bytes_unmarked = MAX_XML_TOKEN_BYTES
    try:
        while chunk := stream.read(READ_CHUNK_BYTES):
            parser.feed(chunk)
            if builder.events:
                stream.mark()
                builder.events = 0
            if builder.entries:
                yield from builder.entries
                builder.entries = []
            if builder.root_ended:  # what may follow the root builds nothing
                stream.max_bytes_unmarked = None
        parser.close()
    except ParseError as exc:
        raise SitemapError(f"bad XML: {exc}") from None
    except LookupError as exc:  # an encoding Python does not know, named in the declaration
        raise SitemapError(f"bad XML: {str(exc)[:100]}") from None
    except defusedxml.DTDForbidden:
        raise SitemapError("XML with a DTD refused (entity expansion risk)") from None
    except defusedxml.DefusedXmlException as exc:
        raise SitemapError(f"XML refused: {exc.__class__.__name__}") from None
    yield from builder.entries  # none: an entry ends before its root does
    if not builder.kind:
        raise SitemapError("empty document")


class _EntryBuilder:
    """Takes expat's element events for a urlset or index and keeps only what an entry needs:
    the text of the first MAX_ENTRY_FIELDS field elements of each direct child of the root.
    No tree is built; everything else (images, extensions, junk) is skipped as it streams by.

    Element names arrive as expat gives them ('namespace}loc' or 'loc'): only the local name
    counts, as sitemaps in the wild use several namespaces or none.
    """

    def __init__(self, source: str, warnings: collections.Counter[str]) -> None:
        self.source = source
        self.warnings = warnings
        self.expat: Any = None  # the expat parser feeding this builder, set by the caller
        self.kind = ""  # the root's local name
        self.entries: list[SitemapEntry | ChildSitemap] = []  # made since the caller last took them
        self.events = 0  # starts and ends since the caller last looked
        self.root_ended = False
        self._depth = 0
        self._entry_name = ""
        self._fields: dict[str, str] = {}
        self._fields_seen = 0
        self._field = ""  # the field element being read, at depth 3
        self._text: list[str] = []  # its text so far
        self._reading = False  # as ElementTree's .text: a field's text ends where a child begins

    def start(self, tag: str, attributes: list[str]) -> None:
        self.events += 1
        self._depth = depth = self._depth + 1
        if depth == 3:  # a field of an entry
            name = tag.rpartition("}")[2]
            if name in ENTRY_FIELDS:
                self._fields_seen += 1
                if self._fields_seen <= MAX_ENTRY_FIELDS:
                    self._field, self._text, self._reading = name, [], True
        elif depth == 2:  # an entry
            self._entry_name = tag.rpartition("}")[2]
            self._fields = {}
            self._fields_seen = 0
        elif depth == 1:
            self.kind = tag.rpartition("}")[2]
            if self.kind in FEED_ROOTS:
                self._read_feed(tag, attributes)
            elif self.kind.lower() == "html":
                raise SitemapError(NOT_A_SITEMAP_HTML)
            elif self.kind not in ("urlset", "sitemapindex"):
                raise SitemapError(f"not a sitemap (root element <{self.kind[:40]}>)")
        else:
            self._reading = False
            if depth > MAX_XML_DEPTH:
                raise SitemapError(f"XML nested deeper than {MAX_XML_DEPTH} elements")

    def data(self, text: str) -> None:
        if self._reading:
            self._text.append(text)

    def end(self, _tag: str) -> None:
        self.events += 1
        depth = self._depth
        self._depth = depth - 1
        if depth == 3:
            if self._field:
                self._fields[self._field] = "".join(self._text).strip()
                self._field, self._reading = "", False
        elif depth == 2:
            entry = _entry(self._entry_name, self._fields, self.kind, self.source, self.warnings)
            if entry is not None:
                self.entries.append(entry)
        elif depth == 1:
            self.root_ended = True

    def close(self) -> None:
        pass

    def _read_feed(self, root_tag: str, attributes: list[str]) -> None:
        """From the root on, expat's events go to a FeedBuilder, whose items come back through
        `add_feed_item`. Swapping expat's handlers costs the urlsets' hot path nothing."""
        feed = FeedBuilder(self, MAX_XML_DEPTH, MAX_ENTRY_FIELDS)
        self.expat.StartElementHandler = feed.start
        self.expat.EndElementHandler = feed.end
        self.expat.CharacterDataHandler = feed.data
        self._depth = 0
        self.events -= 1  # the root's start is counted again by the feed builder
        feed.start(root_tag, attributes)

    def add_feed_item(self, link: str, date: str | None, date_is_rss: bool) -> None:
        url = _join(self.source, link)
        if url is not None:
            lastmod = _date(date or "", self.warnings, rss=date_is_rss)
            self.entries.append(SitemapEntry(url=url, source=self.source, lastmod=lastmod))

    def nested_too_deep(self) -> NoReturn:
        raise SitemapError(f"XML nested deeper than {MAX_XML_DEPTH} elements")


def _entry(
    name: str,
    fields: dict[str, str],
    kind: str,
    source: str,
    warnings: collections.Counter[str] | None = None,
) -> SitemapEntry | ChildSitemap | None:
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
            lastmod=_date(fields.get("lastmod", ""), warnings),
            priority=_priority(fields.get("priority", "")),
            changefreq=changefreq if changefreq in CHANGEFREQS else None,
        )
    return None


def _date(text: str, warnings: collections.Counter[str] | None, rss: bool = False) -> str | None:
    """`text` in UTC ISO 8601; None, counted as a warning, when it is there but is no date."""
    if not text:
        return None
    text = text[:MAX_LASTMOD_CHARS]
    normal = normalise_rss_date(text) if rss else normalise_lastmod(text)
    if normal is None and warnings is not None:
        warnings[INVALID_LASTMOD] += 1
    return normal


def _priority(text: str) -> float | None:
    if not text:  # most entries have none, and a float() that fails costs an exception
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None
