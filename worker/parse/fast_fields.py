"""The standard page fields read from lxml's own tree, without building BeautifulSoup's.

On real pages (bench/real_corpus.py: 93 KB on average) building bs4's tree is three quarters of
a page's parse: a Python object per node, where lxml keeps its nodes in C. The fields we store
(title, description, canonical, lang, first h1, visible text, links) need none of bs4's API, so
`scan_lxml` reads them from the tree lxml builds of the same markup with the same parser
settings bs4 uses (HTMLParser, recover, fed the text). It reads them exactly as
worker/parse/page.py's `_Scan` reads the soup, and with bs4's idea of a string:

- bs4 gives strings under <script>, <style>, <template>, <rt> and <rp> (the innermost such
  ancestor) classes of their own (Script, Stylesheet, ...), and get_text() and the visible-text
  walk take plain strings only; lxml has no such classes, so the walk carries the innermost of
  those ancestors down.
- An element's .text is its first string child; each child's .tail is the string after it.
  Comments and processing instructions are nodes in both trees, and their text is not text.

It does not decide the page's fate: a page near the parse budget, or without a <body>, is
handed back (None) to the bs4 path, whose errors and results stay the reference.
tests/unit/test_fast_fields.py compares both paths, every field, on the demo site, generated
pages, hostile markup and, when it is downloaded, every page of the real corpus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from lxml import etree

from worker.parse.budget import ParseBudget

# The tags whose strings bs4 makes a class of their own (builder.string_containers).
_CONTAINERS = frozenset({"script", "style", "template", "rt", "rp"})
_INVISIBLE_TAGS = frozenset({"script", "style", "noscript", "template"})
_FIELD_TAGS = frozenset({"a", "area", "base", "h1", "html", "link", "meta", "title"})
# Pages this close to a budget go the bs4 way, which counts nodes as it builds and fails exactly.
_BUDGET_MARGIN = 0.5
# libxml2 stops building its own tree at 256 levels (bs4's builder, fed by events, goes on), so
# deeper pages go the bs4 way too; real pages nest a few dozen levels.
_MAX_TREE_DEPTH = 128
# Nodes (elements, strings, comments, attributes), about as the bs4 builder counts them, in C:
# only compared against half the budget.
_COUNT_NODES = etree.XPath("count(//node()) + count(//@*)")


@dataclass
class LxmlScan:
    """What worker/parse/page.py's _Scan collects, with the same names."""

    base_href: str | None = None
    title: str | None = None
    description: str | None = None
    canonical_href: str | None = None
    lang: str | None = None
    h1: str | None = None
    hrefs: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    nofollow_hrefs: list[str] = field(default_factory=list)  # of <a rel="nofollow">, also in hrefs
    robots_nofollow: bool = False  # a <meta name="robots"> says nofollow (or none)
    _seen: set[str] = field(default_factory=set)


def scan_lxml(markup: str, budget: ParseBudget) -> LxmlScan | None:
    """The page's fields from lxml's tree, or None when the bs4 path must decide."""
    started = time.monotonic()
    # Every element starts with a '<': a page with more of them than the margin allows goes
    # straight to the bs4 path, without building an lxml tree first (two trees of a hostile
    # page's size, one after the other, raised the worker's peak memory by tens of MiB).
    if markup.count("<") > budget.max_nodes * _BUDGET_MARGIN:
        return None
    try:
        parser = etree.HTMLParser(recover=True)  # CDATA: lxml's HTML parser keeps it anyway
        parser.feed(markup)
        root = parser.close()
    except Exception:  # lxml fails in many ways on hostile input: the bs4 path gives the verdict
        return None
    if root is None:
        return None
    text_root = next(root.iter("body"), None)
    if text_root is None:
        return None
    if _COUNT_NODES(root) > budget.max_nodes * _BUDGET_MARGIN:
        return None
    scan = LxmlScan()
    depth = _walk(root, text_root, scan)
    if depth > min(budget.max_depth * _BUDGET_MARGIN, _MAX_TREE_DEPTH):
        return None
    if time.monotonic() - started > budget.deadline_s * _BUDGET_MARGIN:
        return None
    return scan


def _walk(root: etree._Element, text_root: etree._Element, scan: LxmlScan) -> int:
    """Collect the fields into `scan`; return the deepest nesting of elements."""
    # Preceding siblings of the root (comments, processing instructions) hold no fields, and
    # the text root is a <body>, never the document: top-level strings are never visible text.
    text = scan.text
    # A frame: (children, inside an <svg>, children's strings are visible, and plain; the
    # element's tail, a string of its parent that comes after all of it, or None).
    stack: list[tuple[Iterator[etree._Element], bool, bool, bool, str | None]] = [
        (iter((root,)), False, False, True, None)
    ]
    deepest = 0
    while stack:
        children, in_svg, visible, plain, _ = stack[-1]
        child = next(children, None)
        if child is None:
            tail = stack.pop()[4]
            if tail:
                text.append(tail)
            continue
        # The tail is a string of the parent: visible and plain as the parent's children are.
        tail = child.tail if visible and plain else None
        name = child.tag
        if not isinstance(name, str):  # a comment or processing instruction: no text of its own
            if tail:
                text.append(tail)
            continue
        if name in _FIELD_TAGS:
            _read(scan, child, name, in_svg)
        shows = (visible or child is text_root) and name not in _INVISIBLE_TAGS
        inner_plain = plain and name not in _CONTAINERS
        if shows and inner_plain and child.text:
            text.append(child.text)
        stack.append((iter(child), in_svg or name == "svg", shows, inner_plain, tail))
        deepest = max(deepest, len(stack) - 1)
    return deepest


def _read(scan: LxmlScan, tag: etree._Element, name: str, in_svg: bool) -> None:
    if name in ("a", "area"):
        href = _attr(tag, "href")
        if href:
            scan.hrefs.append(href)
            # Most links have no rel: one lookup tells, without the calls that read a rel.
            rel = tag.get("rel")
            if rel is not None and says_nofollow(rel):
                scan.nofollow_hrefs.append(href)
        return
    if name == "meta" and (_attr(tag, "name") or "").lower() == "robots":
        scan.robots_nofollow = scan.robots_nofollow or robots_says_nofollow(_attr(tag, "content"))
        return
    if name in scan._seen or (name == "title" and in_svg):
        return
    _read_first(scan, tag, name)


def _read_first(scan: LxmlScan, tag: etree._Element, name: str) -> None:
    """The first <title>, description <meta>, canonical <link>, <base>, <html> or <h1>."""
    if name == "title":
        scan.title = _collapse(_strings(tag, "")) or None
    elif name == "meta":
        if (_attr(tag, "name") or "").lower() != "description":
            return
        content = _attr(tag, "content")
        scan.description = _collapse(content) if content else None
    elif name == "link":
        href = _attr(tag, "href")
        if "canonical" not in (_attr(tag, "rel") or "").lower().split() or not href:
            return
        scan.canonical_href = href
    elif name == "base":
        scan.base_href = _attr(tag, "href")
    elif name == "html":
        scan.lang = _attr(tag, "lang")
    elif name == "h1":
        scan.h1 = _collapse(_strings(tag, " "))
    scan._seen.add(name)


def _strings(tag: etree._Element, separator: str) -> str:
    """bs4's tag.get_text(separator): the plain strings under the tag, in document order."""
    found: list[str] = []
    inside_container = any(a.tag in _CONTAINERS for a in tag.iterancestors())
    _collect(tag, not inside_container and tag.tag not in _CONTAINERS, found)
    return separator.join(found)


def _collect(element: etree._Element, plain: bool, found: list[str]) -> None:
    # Recursion is bounded: only pages within half the depth budget get here.
    if plain and element.text:
        found.append(element.text)
    for child in element:
        if isinstance(child.tag, str):  # comments and processing instructions have no strings
            _collect(child, plain and child.tag not in _CONTAINERS, found)
        if plain and child.tail:
            found.append(child.tail)


def says_nofollow(rel: str | None) -> bool:
    return rel is not None and "nofollow" in rel.lower().split()


def robots_says_nofollow(directives: str | None) -> bool:
    """A meta robots content or an X-Robots-Tag value that forbids following links."""
    if not directives:
        return False
    words = {word.strip() for word in directives.lower().replace(":", ",").split(",")}
    return "nofollow" in words or "none" in words


def _attr(tag: etree._Element, name: str) -> str | None:
    value = tag.get(name)
    if not isinstance(value, str):
        return None
    return value.strip() or None


def _collapse(text: str) -> str:
    return " ".join(text.split())
