"""Turn a fetched HTML body into text and the page fields we store.

`decode_html` picks the character encoding; `parse_page` extracts fields with BeautifulSoup
on lxml. Any failure inside the parser becomes PermanentError('parse_error'): the same bytes
would fail the same way on every retry.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin, urlsplit

from bs4 import BeautifulSoup, Tag

from shared.errors import PermanentError

MAX_TEXT_CHARS = 100_000
MAX_LINKS = 1_000

# Their text is never shown to a reader.
_INVISIBLE_TAGS = ("script", "style", "noscript", "template")

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


def parse_page(
    html: str | bytes,
    base_url: str,
    *,
    max_text_chars: int = MAX_TEXT_CHARS,
    max_links: int = MAX_LINKS,
) -> ParsedPage:
    """Extract the page fields; raise PermanentError('parse_error') if the parser fails."""
    try:
        return _parse(html, base_url, max_text_chars, max_links)
    except Exception as exc:  # lxml and bs4 fail in many ways on hostile input; all are final
        raise PermanentError("parse_error", f"{base_url}: {type(exc).__name__}: {exc}") from None


def _parse(html: str | bytes, base_url: str, max_text_chars: int, max_links: int) -> ParsedPage:
    soup = BeautifulSoup(html, "lxml")
    base = _base_url(soup, base_url)
    title = _title(soup)
    description = _meta_description(soup)
    canonical = _canonical(soup, base)
    lang = _attr(soup.find("html"), "lang")
    h1_tag = soup.find("h1")
    h1 = _collapse(h1_tag.get_text(" ")) if isinstance(h1_tag, Tag) else None
    links = _links(soup, base, max_links)
    # Last: removing the invisible elements changes the tree the other fields were read from.
    text = _visible_text(soup)[:max_text_chars]
    return ParsedPage(
        base_url=base,
        title=title,
        description=description,
        canonical_url=canonical,
        lang=lang,
        h1=h1 or None,
        text=text,
        links=links,
    )


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


def _absolute_http(base: str, href: str) -> str | None:
    """`href` resolved against `base`, fragment dropped; None unless it is an http(s) URL."""
    try:
        url, _fragment = urldefrag(urljoin(base, href.strip()))
        parts = urlsplit(url)
    except ValueError:  # e.g. a malformed IPv6 host
        return None
    return url if parts.scheme in ("http", "https") and parts.netloc else None


def _base_url(soup: BeautifulSoup, page_url: str) -> str:
    href = _attr(soup.find("base"), "href")
    return (_absolute_http(page_url, href) if href else None) or page_url


def _title(soup: BeautifulSoup) -> str | None:
    for tag in soup.find_all("title"):
        # An SVG <title> is a tooltip of a drawing, not the page's title.
        if isinstance(tag, Tag) and tag.find_parent("svg") is None:
            return _collapse(tag.get_text()) or None
    return None


def _meta_description(soup: BeautifulSoup) -> str | None:
    for tag in soup.find_all("meta"):
        if (_attr(tag, "name") or "").lower() == "description":
            content = _attr(tag, "content")
            return _collapse(content) if content else None
    return None


def _canonical(soup: BeautifulSoup, base: str) -> str | None:
    for tag in soup.find_all("link"):
        rel = (_attr(tag, "rel") or "").lower().split()
        href = _attr(tag, "href")
        if "canonical" in rel and href:
            return _absolute_http(base, href)
    return None


def _links(soup: BeautifulSoup, base: str, max_links: int) -> tuple[str, ...]:
    found: dict[str, None] = {}  # a dict keeps first-seen order and de-duplicates
    for tag in soup.find_all(["a", "area"]):
        href = _attr(tag, "href")
        url = _absolute_http(base, href) if href else None
        if url:
            found.setdefault(url)
            if len(found) >= max_links:
                break
    return tuple(found)


def _visible_text(soup: BeautifulSoup) -> str:
    for tag in soup.find_all(_INVISIBLE_TAGS):
        if isinstance(tag, Tag):
            tag.decompose()
    root = soup.body or soup
    # get_text skips comments; the separator keeps words in adjacent elements apart.
    return _collapse(root.get_text(" "))
