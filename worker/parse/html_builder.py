"""bs4's own lxml tree builder, counting what it builds against a ParseBudget
(worker/parse/budget.py): `BudgetedTreeBuilder`, the public path worker/parse/soup.py takes
where the faster worker/parse/bs4_fastpath.py (which builds on this one) may not be used.

Both builders count nodes (elements, attributes, strings, comments), nesting depth and time the
same way as the tree is built, and stop with ParseLimitExceeded the moment one runs out, so a
hostile page costs at most its budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bs4 import BeautifulSoup
from bs4.builder import builder_registry

from worker.parse.budget import UNLIMITED, ParseBudget, ParseLimitExceeded

# bs4's lxml builder for HTML, as BeautifulSoup(markup, "lxml") picks it.
LXML_HTML_BUILDER: Any = builder_registry.lookup("lxml", "html")
if LXML_HTML_BUILDER is None:  # pragma: no cover - lxml is a dependency
    raise ImportError("bs4 finds no lxml tree builder: is lxml installed?")

# The clock is read once per this many nodes: often enough, and cheap per node.
_NODES_PER_CLOCK_READ = 1024


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
    instruction after it does not count it): worker/parse/bs4_fastpath.py counts the same way, so a
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
