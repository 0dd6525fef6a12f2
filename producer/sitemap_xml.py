"""Sitemap XML (urlsets and indexes), streamed: expat's events in, entries out, no tree built.

Feeds (RSS, Atom) are handed over to producer/feeds.py at their root element. Dates are
normalised here (producer/lastmod.py), and one that is no date is counted as a warning.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any, NoReturn, Protocol
from xml.etree.ElementTree import ParseError

import defusedxml
import defusedxml.ElementTree

from producer.feeds import FEED_ROOTS, FeedBuilder
from producer.lastmod import normalise_lastmod, normalise_rss_date
from producer.sitemap_types import ChildSitemap, SitemapEntry, SitemapError, join_url

READ_CHUNK_BYTES = 64 * 1024
CHANGEFREQS = frozenset({"always", "hourly", "daily", "weekly", "monthly", "yearly", "never"})
MAX_LASTMOD_CHARS = 64
ENTRY_FIELDS = frozenset({"loc", "lastmod", "priority", "changefreq"})
MAX_ENTRY_FIELDS = 16  # kept per entry; a <url> holding a million <loc>s keeps only the first
MAX_XML_DEPTH = 32  # sitemaps nest 4 deep, and every open element stays in memory
# The bytes of one tag or text run (between two parser events). expat turns a tag's attributes
# into objects some 30 times their size, so one giant tag must not reach the parser whole.
MAX_XML_TOKEN_BYTES = 256 * 1024
NOT_A_SITEMAP_HTML = "not a sitemap (HTML page)"
INVALID_LASTMOD = "invalid_lastmod"


class Stream(Protocol):
    """A body read in chunks under a byte cap (sitemaps._CappedReader)."""

    max_bytes_unmarked: int | None

    def read(self, size: int = -1) -> bytes: ...
    def mark(self) -> None: ...


def parse_xml(
    stream: Stream, source: str, warnings: collections.Counter[str]
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
        url = join_url(self.source, link)
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
