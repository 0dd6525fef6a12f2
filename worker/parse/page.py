"""Turn a fetched HTML body into text and the page fields we store.

`decode_html` picks the character encoding; `parse_page` reads the fields from lxml's own tree
(worker/parse/fast_fields.py) and, for a page that path hands back, from BeautifulSoup on lxml
(through worker/parse/html_builder.py), the reference both are held to. Any failure inside the parser becomes
PermanentError('parse_error'): the same bytes would fail the same way on every retry. A page past
its ParseBudget (nodes, depth, time: PARSE_MAX_NODES, PARSE_MAX_DEPTH, PARSE_DEADLINE_S) becomes
PermanentError('parse_limit'), and costs no more than that budget (docs/SECURITY.md).
"""

from __future__ import annotations

import codecs
import collections
import re
from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin, urlsplit

from bs4 import BeautifulSoup, Tag
from bs4.element import CData, NavigableString

from shared.errors import PermanentError
from shared.settings import Settings
from worker.parse.budget import ParseBudget, ParseLimitExceeded
from worker.parse.fast_fields import LxmlScan, robots_says_nofollow, says_nofollow, scan_lxml
from worker.parse.fast_links import RelativeLinks, relative_key, split_base
from worker.parse.html_builder import take_apart
from worker.parse.markup_scan import MarkupScan
from worker.parse.soup import new_soup

MAX_TEXT_CHARS = 100_000
MAX_LINKS = 1_000
DEFAULT_BUDGET = ParseBudget()

# Their text is never shown to a reader.
_INVISIBLE_TAGS = frozenset({"script", "style", "noscript", "template"})
# Tags a page field is read from.
_FIELD_TAGS = frozenset({"a", "area", "base", "h1", "html", "link", "meta", "title"})
# What get_text() would join: not comments, doctypes, declarations or processing instructions.
_TEXT_STRINGS = frozenset({NavigableString, CData})
# A path from the site's root that needs no resolving: no "//" authority, query, fragment,
# parameters (";", which urljoin re-assembles), backslash, space, control or non-ASCII
# character, and (checked apart) no dot segment.
_PLAIN_PATH = re.compile(r"/(?!/)[A-Za-z0-9\-._~%!$&'()*+,=:@/]*")

# The HTML standard looks for a <meta charset> in the first 1024 bytes only.
_META_PRESCAN_BYTES = 1024
_META_CHARSET = re.compile(rb"""<meta[^>]{0,300}?charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]{1,40})""", re.I)

# Browsers decode these labels as windows-1252, and pages labelled so rely on it.
_WINDOWS_1252_LABELS = frozenset({"iso-8859-1", "iso8859-1", "latin1", "latin-1", "us-ascii", "ascii"})


@dataclass(frozen=True)
class ParsedPage:
    base_url: str  # the URL relative links were resolved against (a <base href> wins)
    title: str | None
    description: str | None  # <meta name="description">
    canonical_url: str | None  # <link rel="canonical">, absolute
    lang: str | None  # <html lang>
    h1: str | None  # text of the first <h1>
    text: str  # visible text, whitespace collapsed, capped
    links: tuple[str, ...]  # absolute http(s) URLs without fragments, first occurrence order
    # The links a discovery run may follow: not rel="nofollow" (unless another link to the same
    # URL is not), none when a <meta name="robots"> says nofollow.
    follow: tuple[str, ...] = ()


def decode_html(body: bytes, content_type: str | None = None) -> str:
    """Bytes to text: a byte-order mark, else the Content-Type charset, else a <meta> charset,
    else UTF-8. Undecodable bytes become U+FFFD rather than failing the page."""
    for codec in (_bom_codec(body), _codec(_charset_param(content_type)), _meta_codec(body)):
        if codec:
            return body.decode(codec, errors="replace")
    return body.decode("utf-8", errors="replace")


def _bom_codec(body: bytes) -> str | None:
    if body.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    return None


def _charset_param(content_type: str | None) -> str | None:
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip("'\"")
    return None


def _meta_codec(body: bytes) -> str | None:
    match = _META_CHARSET.search(body[:_META_PRESCAN_BYTES])
    codec = _codec(match.group(1).decode("ascii")) if match else None
    # A <meta> that could be read as ASCII cannot truthfully announce UTF-16.
    return "utf-8" if codec and codec.startswith("utf-16") else codec


def _codec(label: str | None) -> str | None:
    if not label:
        return None
    label = label.strip().lower()
    if label in _WINDOWS_1252_LABELS:
        return "cp1252"
    try:
        info = codecs.lookup(label)
    except LookupError:
        return None
    # Python also has bytes-to-bytes "codecs" (base64, hex, zlib, ...) and some that refuse
    # the "replace" error handler (idna): a page that names one as its charset must not reach them.
    if not getattr(info, "_is_text_encoding", True):
        return None
    try:
        b"<html>".decode(info.name, errors="replace")
    except (UnicodeError, LookupError, TypeError, ValueError):
        return None
    return info.name


def parse_budget(settings: Settings) -> ParseBudget:
    return ParseBudget(settings.parse_max_nodes, settings.parse_max_depth, settings.parse_deadline_s)


def parse_page(
    html: str | bytes,
    base_url: str,
    *,
    max_text_chars: int = MAX_TEXT_CHARS,
    max_links: int = MAX_LINKS,
    budget: ParseBudget = DEFAULT_BUDGET,
    fast: bool = True,
    private_api: bool = True,
) -> ParsedPage:
    """Extract the page fields; raise PermanentError('parse_error') if the parser fails, and
    PermanentError('parse_limit') past the budget. `fast`: read them from lxml's tree when it
    can (worker/parse/fast_fields.py); False always builds BeautifulSoup's, the reference.
    `private_api=False` builds that tree through bs4's public API only (worker/parse/html_builder.py)."""
    try:
        return _parse(html, base_url, max_text_chars, max_links, budget, fast, private_api)
    except ParseLimitExceeded as exc:
        raise PermanentError("parse_limit", f"{base_url}: {exc}") from None
    except Exception as exc:  # lxml and bs4 fail in many ways on hostile input; all are final
        raise PermanentError("parse_error", f"{base_url}: {type(exc).__name__}: {exc}") from None


def _parse(
    html: str | bytes,
    base_url: str,
    max_text_chars: int,
    max_links: int,
    budget: ParseBudget,
    fast: bool,
    private_api: bool = True,
) -> ParsedPage:
    # No multi-valued attributes: `rel` and `class` stay strings, which saves splitting every
    # class attribute of the page for fields that never read one.
    if isinstance(html, bytes):  # decoded by our rules, which the worker applies to every page
        html = decode_html(html)
    MarkupScan(budget).scan_text(html)  # refuse a page that cannot fit before building anything
    scan = (fast and scan_lxml(html, budget)) or _soup_scan(html, budget, private_api)
    base = (_absolute_http(base_url, scan.base_href) if scan.base_href else None) or base_url
    links = _links(scan.hrefs, base, max_links)
    return ParsedPage(
        base_url=base,
        title=scan.title,
        description=scan.description,
        canonical_url=_absolute_http(base, scan.canonical_href) if scan.canonical_href else None,
        lang=scan.lang,
        h1=scan.h1 or None,
        text=" ".join(" ".join(scan.text).split())[:max_text_chars],
        links=links,
        follow=_followed(scan, links, base, max_links),
    )


def _followed(scan: _Scan | LxmlScan, links: tuple[str, ...], base: str, max_links: int) -> tuple[str, ...]:
    """The page's links less those only rel="nofollow" links reach: most pages have none, and
    then it is the page's links as they are."""
    if scan.robots_nofollow:
        return ()
    if not scan.nofollow_hrefs:
        return links
    # An href that some link without nofollow has too is followed.
    plain = collections.Counter(scan.hrefs)
    plain.subtract(scan.nofollow_hrefs)
    reached = set(_links([href for href, n in plain.items() if n > 0], base, max_links))
    return tuple(url for url in links if url in reached)


def _soup_scan(html: str, budget: ParseBudget, private_api: bool = True) -> _Scan:
    soup = new_soup(html, multi_valued_attributes=False, budget=budget, private_api=private_api)
    scan = _Scan()
    scan.walk(soup, _first_body(soup) or soup)
    # A soup is a web of parent, sibling and next/previous-element references: dropped as it
    # is, only the cyclic garbage collector frees it, and dead soups pile up in memory between
    # its full passes. Taken apart (every node emptied, in document order), it is freed by
    # reference counting at once. Not soup.decompose(): bs4's decompose empties the elements it
    # reaches through next_element, and the BeautifulSoup object's next_element is None, so
    # called on the soup it empties the soup object alone and leaves every node in its cycles.
    take_apart(soup)
    return scan


class _Scan:
    """The page fields, read in one walk over the tree: a find_all per field walked the whole
    tree once each, and that cost as much as building it."""

    def __init__(self) -> None:
        self.base_href: str | None = None
        self.title: str | None = None
        self.description: str | None = None
        self.canonical_href: str | None = None
        self.lang: str | None = None
        self.h1: str | None = None
        self.hrefs: list[str] = []
        self.text: list[str] = []  # visible strings of the text root, in document order
        self.nofollow_hrefs: list[str] = []  # of <a rel="nofollow">, also in hrefs
        self.robots_nofollow = False  # a <meta name="robots"> says nofollow (or none)
        self._seen: set[str] = set()  # fields that take their first occurrence only

    def walk(self, soup: BeautifulSoup, text_root: Tag) -> None:
        # An explicit stack, not recursion: hostile pages nest deeper than Python's recursion limit.
        # A frame is (children, inside an <svg>, inside the visible part of the text root).
        stack = [(iter(soup.contents), False, text_root is soup)]
        while stack:
            children, in_svg, visible = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
            elif isinstance(child, Tag):
                if child.name in _FIELD_TAGS:
                    self._read(child, in_svg)
                shows = (visible or child is text_root) and child.name not in _INVISIBLE_TAGS
                stack.append((iter(child.contents), in_svg or child.name == "svg", shows))
            elif visible and type(child) in _TEXT_STRINGS:
                self.text.append(str(child))

    def _read(self, tag: Tag, in_svg: bool) -> None:
        name = tag.name
        if name in ("a", "area"):
            href = _attr(tag, "href")
            if href:
                self.hrefs.append(href)
                if says_nofollow(_attr(tag, "rel")):
                    self.nofollow_hrefs.append(href)
            return
        if name == "meta" and (_attr(tag, "name") or "").lower() == "robots":
            self.robots_nofollow = self.robots_nofollow or robots_says_nofollow(_attr(tag, "content"))
            return
        # An SVG <title> is a tooltip of a drawing, not the page's title.
        if name in self._seen or (name == "title" and in_svg):
            return
        if self._read_first(tag, name):
            self._seen.add(name)

    def _read_first(self, tag: Tag, name: str) -> bool:
        """Take the field the first tag of this name gives; False for one that gives none."""
        if name == "title":
            self.title = _collapse(tag.get_text()) or None
        elif name == "meta":
            if (_attr(tag, "name") or "").lower() != "description":
                return False
            content = _attr(tag, "content")
            self.description = _collapse(content) if content else None
        elif name == "link":
            href = _attr(tag, "href")
            if "canonical" not in (_attr(tag, "rel") or "").lower().split() or not href:
                return False
            self.canonical_href = href
        elif name == "base":
            self.base_href = _attr(tag, "href")
        elif name == "html":
            self.lang = _attr(tag, "lang")
        elif name == "h1":
            self.h1 = _collapse(tag.get_text(" "))
        return True


def _first_body(soup: BeautifulSoup) -> Tag | None:
    """soup.body, the first <body> in document order, without bs4's general search: that
    sets up a filter and matches it against every node it passes, a fiftieth of a page's CPU.
    The body follows the few nodes of the head."""
    for node in soup.descendants:
        if type(node) is Tag and node.name == "body":
            return node
    return None


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _attr(tag: object, name: str) -> str | None:
    """A single-valued attribute, stripped; None when missing or blank."""
    if not isinstance(tag, Tag):
        return None
    value = tag.get(name)
    if isinstance(value, list):  # bs4 splits multi-valued attributes such as class and rel
        value = " ".join(value)
    if not isinstance(value, str):
        return None
    return value.strip() or None


def _origin(base: str) -> str | None:
    """'http://host:port' of an http(s) base URL, else None."""
    try:
        parts = urlsplit(base)
    except ValueError:
        return None
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") and parts.netloc else None


def _absolute_http(base: str, href: str) -> str | None:
    """`href` resolved against `base`, fragment dropped; None unless it is an http(s) URL."""
    try:
        url = urljoin(base, href.strip())
        if "#" in url:  # urldefrag re-assembles the URL; most links have nothing to drop
            url = urldefrag(url).url
        parts = urlsplit(url)
    except ValueError:  # e.g. a malformed IPv6 host
        return None
    return url if parts.scheme in ("http", "https") and parts.netloc else None


_relative_links = RelativeLinks(_absolute_http)


def _links(hrefs: list[str], base: str, max_links: int) -> tuple[str, ...]:
    found: dict[str, None] = {}  # a dict keeps first-seen order and de-duplicates
    origin = _origin(base)
    split = split_base(base)  # relative hrefs resolve the same for every page of a directory
    # A page repeats its hrefs (a documentation page links each section many times): an href
    # seen before resolves to the same URL, which is already in `found` or was refused.
    for href in dict.fromkeys(hrefs):
        # Most links are plain site-absolute paths, which urljoin would only append to the origin.
        url = origin + href if origin and _PLAIN_PATH.fullmatch(href) and "/." not in href else None
        if not url:
            key = relative_key(href) if split else None
            url = _relative_links.resolve(*split, key) if split and key else _absolute_http(base, href)
        if url:
            found.setdefault(url)
            if len(found) >= max_links:
                break
    return tuple(found)
