"""BeautifulSoup's tree for an HTML page, from lxml's parse, within a budget.

`new_soup(markup)` gives the BeautifulSoup(markup, "lxml") makes. It builds it with
worker/bs4_fastpath.py, which sets each node's fields itself at a third of the cost, where that
module's check passes (the installed beautifulsoup4 is one it was checked on, and it builds the
same tree as bs4 on sample pages); otherwise with `BudgetedTreeBuilder`, bs4's own lxml builder
through its public API, and a warning says so once. `private_api=False` asks for the latter.

A `ParseBudget` bounds what one page may cost: nodes (elements, attributes, strings, comments),
nesting depth and time. Both builders count them the same way as the tree is built, and stop
with ParseLimitExceeded the moment one runs out, so a hostile page costs at most its budget.

One builder, and with it one lxml parser, serves each thread (making the parser checks the
target's methods with `inspect`, a tenth of a page's parse).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bs4 import BeautifulSoup
from bs4.builder import builder_registry

from worker.markup_scan import MarkupScan, ParseLimitExceeded

# bs4's lxml builder for HTML, as BeautifulSoup(markup, "lxml") picks it.
LXML_HTML_BUILDER: Any = builder_registry.lookup("lxml", "html")
if LXML_HTML_BUILDER is None:  # pragma: no cover - lxml is a dependency
    raise ImportError("bs4 finds no lxml tree builder: is lxml installed?")

_builders = threading.local()
# The clock is read once per this many nodes: often enough, and cheap per node.
_NODES_PER_CLOCK_READ = 1024


@dataclass(frozen=True)
class ParseBudget:
    """What one page may cost the parser (PARSE_MAX_NODES, PARSE_MAX_DEPTH, PARSE_DEADLINE_S)."""

    max_nodes: int = 75_000  # elements + attributes + strings + comments
    max_depth: int = 512  # open elements at once, as browsers cap nesting
    deadline_s: float = 5.0
    max_tag_bytes: int = 1024 * 1024  # from a '<' to its '>' (worker/markup_scan.py)

    @property
    def max_marks(self) -> int:
        """The most '<' and '=' a page within the budget is let have (worker/markup_scan.py)."""
        return 4 * self.max_nodes

    def refuse_early(self, markup: str) -> None:
        """Refuse a page that cannot fit, before building anything (worker/markup_scan.py)."""
        MarkupScan(self).scan_text(markup)


UNLIMITED = ParseBudget(sys.maxsize, sys.maxsize, float("inf"), sys.maxsize)


def new_soup(
    markup: str,
    *,
    multi_valued_attributes: bool = True,
    budget: ParseBudget = UNLIMITED,
    clock: Callable[[], float] = time.monotonic,
    private_api: bool = True,
) -> BeautifulSoup:
    """The BeautifulSoup of `markup`, as BeautifulSoup(markup, "lxml") makes it. Without
    multi-valued attributes, `class` and `rel` stay strings instead of lists of words. Past the
    `budget`, raises ParseLimitExceeded, with the part-built tree already taken apart.
    `private_api=False`: built through bs4's public API only (slower, the same tree)."""
    builder = _thread_builder(multi_valued_attributes, private_api)
    builder.set_budget(budget, clock)
    return BeautifulSoup(markup, builder=builder)


def _thread_builder(multi_valued_attributes: bool, private_api: bool) -> BudgetedTreeBuilder:
    key = (multi_valued_attributes, private_api)
    builders: dict[tuple[bool, bool], BudgetedTreeBuilder] = _builders.__dict__.setdefault("by_kind", {})
    builder = builders.get(key)
    if builder is None:
        from worker import bs4_fastpath  # it builds on this module: imported once it is loaded

        kind = bs4_fastpath.HtmlTreeBuilder if private_api and bs4_fastpath.usable() else BudgetedTreeBuilder
        options = {} if multi_valued_attributes else {"multi_valued_attributes": None}
        builder = builders[key] = kind(**options)
    return builder


def take_apart(soup: BeautifulSoup) -> None:
    """Break the reference cycles of a (part-built) tree, so that it is freed at once: left to the
    cyclic garbage collector, a page stopped at its budget would stay in memory until a full
    collection. (soup.decompose() does not reach the nodes: a soup's next_element is None.)"""
    node: Any = soup.contents[0] if soup.contents else None
    vars(soup).clear()
    while node is not None:  # every node, in document order
        following = node.next_element
        vars(node).clear()
        node = following


class BudgetedTreeBuilder(LXML_HTML_BUILDER):  # type: ignore[misc]
    """bs4's lxml builder, counting what it builds against a ParseBudget. Use as
    BeautifulSoup(markup, builder=BudgetedTreeBuilder()), with the builder's usual keyword
    arguments. One instance serves one parse at a time: give each thread its own.

    A string is counted when the tag after it starts or ends (a comment, doctype or processing
    instruction after it does not count it): worker/bs4_fastpath.py counts the same way, so a
    page is stopped at the same node on either path."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._parser: Any = None
        self.set_budget(UNLIMITED)

    def set_budget(self, budget: ParseBudget, clock: Callable[[], float] = time.monotonic) -> None:
        """Bound the next parse (see ParseBudget)."""
        self._budget = budget
        self._max_depth = budget.max_depth
        self._clock = clock
        self._deadline = clock() + budget.deadline_s
        self._nodes = 0
        # Node callbacks only add and compare; the limits are looked at when this count is reached.
        self._checkpoint = min(_NODES_PER_CLOCK_READ, budget.max_nodes + 1)

    def _check_budget(self, depth: int = 0) -> None:
        if depth > self._max_depth:
            raise ParseLimitExceeded(f"nested deeper than {self._max_depth} elements")
        if self._nodes > self._budget.max_nodes:
            raise ParseLimitExceeded(f"more than {self._budget.max_nodes} nodes")
        if self._clock() > self._deadline:
            raise ParseLimitExceeded(f"took longer than {self._budget.deadline_s:g} s")
        self._checkpoint = min(self._nodes + _NODES_PER_CLOCK_READ, self._budget.max_nodes + 1)

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes >= self._checkpoint:
            self._check_budget()

    def _count_tag(self, attributes: int) -> None:
        """A start tag: itself, its attributes, and the depth it opens at (the soup is at the
        bottom of the stack)."""
        assert self.soup is not None  # set by the BeautifulSoup that feeds us
        depth = len(self.soup.tagStack)
        nodes = self._nodes = self._nodes + 1 + attributes
        if nodes >= self._checkpoint or depth > self._max_depth:
            self._check_budget(depth)

    def parser_for(self, encoding: Any) -> Any:
        if encoding is not None:  # bytes markup, tried in one encoding after another
            return super().parser_for(encoding)
        if self._parser is None:
            self._parser = super().parser_for(None)
        return self._parser

    def feed(self, markup: Any) -> None:
        try:
            super().feed(markup)
        except BaseException:
            self._parser = None  # a parse broken off may leave the parser in any state
            if self.soup is not None:
                take_apart(self.soup)
            raise

    def comment(self, text: Any) -> None:
        self._count(1)
        super().comment(text)

    def pi(self, target: Any, data: Any) -> None:
        self._count(1)
        super().pi(target, data)

    def doctype(self, name: Any, pubid: Any, system: Any) -> None:
        self._count(1)
        super().doctype(name, pubid, system)

    def start(self, tag: Any, attrib: Any, nsmap: Any = None) -> None:
        assert self.soup is not None
        if self.soup.current_data:  # the string this tag ends
            self._count(1)
        self._count_tag(len(attrib))
        super().start(tag, attrib, {} if nsmap is None else nsmap)

    def end(self, tag: Any) -> None:
        assert self.soup is not None
        if self.soup.current_data:
            self._count(1)
        super().end(tag)
