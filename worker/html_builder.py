"""BeautifulSoup's tree for an HTML page, built from lxml's parse at a third of the cost.

bs4's lxml builder spends about 10 us a node in Python: every tag goes through the XML
builder's namespace bookkeeping, `handle_starttag`, `Tag.__init__` (two dozen fields, each
decided by asking the builder) and `pushTag`, every string through `endData`,
`string_container` and `object_was_parsed`, and every end tag through `_popToTag`. Building
the tree was the largest single cost of a page in a worker (docs/PERFORMANCE.md).

`HtmlTreeBuilder` takes the same lxml events and builds the same objects, but sets each node's
fields in one step: the fields that depend only on the tag's name are worked out once per name
and copied in, and the links between nodes are set as bs4 would leave them once parsing is done.
tests/unit/test_html_builder.py compares every field of every node, and the soup's own parse
state, with bs4's builder on fixed and generated markup; beautifulsoup4 is pinned to the
versions it was checked against. What this builder does not speed up, it hands to bs4's own
code: comments, doctypes, processing instructions, namespaced attribute names, and end tags
that do not close the innermost open tag.

Use `new_soup(markup)`: it reuses one builder, and with it one lxml parser, per thread
(making the parser checks the target's methods with `inspect`, a tenth of a page's parse).

A `ParseBudget` bounds what one page may cost: nodes (elements, attributes, strings, comments),
nesting depth and time. They are counted as the tree is built, and the build stops with
ParseLimitExceeded the moment one runs out, so a hostile page costs at most its budget.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bs4 import BeautifulSoup
from bs4.builder._lxml import LXMLTreeBuilder
from bs4.element import NavigableString, Tag

from worker.markup_scan import MarkupScan, ParseLimitExceeded

_new_tag = Tag.__new__
_new_string = str.__new__  # NavigableString.__new__ without its setup(), done here instead
_ASCII_SPACES = BeautifulSoup.ASCII_SPACES  # what bs4 collapses a blank string to one space of

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
) -> BeautifulSoup:
    """The BeautifulSoup of `markup`, as BeautifulSoup(markup, "lxml") makes it. Without
    multi-valued attributes, `class` and `rel` stay strings instead of lists of words. Past the
    `budget`, raises ParseLimitExceeded, with the part-built tree already taken apart."""
    key = "multi" if multi_valued_attributes else "single"
    builder = getattr(_builders, key, None)
    if builder is None:
        builder = HtmlTreeBuilder(**({} if multi_valued_attributes else {"multi_valued_attributes": None}))
        setattr(_builders, key, builder)
    builder.set_budget(budget, clock)
    return BeautifulSoup(markup, builder=builder)


def _take_apart(soup: BeautifulSoup) -> None:
    """Break the reference cycles of a (part-built) tree, so that it is freed at once: left to the
    cyclic garbage collector, a page stopped at its budget would stay in memory until a full
    collection. (soup.decompose() does not reach the nodes: a soup's next_element is None.)"""
    node: Any = soup.contents[0] if soup.contents else None
    soup.__dict__.clear()
    while node is not None:  # every node, in document order
        following = node.next_element
        node.__dict__.clear()
        node = following


class HtmlTreeBuilder(LXMLTreeBuilder):
    """Use as BeautifulSoup(markup, builder=HtmlTreeBuilder()), with the builder's usual keyword
    arguments. One instance serves one parse at a time: give each thread its own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fields_by_name: dict[str, dict[str, Any]] = {}
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

    def initialize_soup(self, soup: BeautifulSoup) -> None:
        super().initialize_soup(soup)
        if soup.element_classes or soup.parse_only:
            raise ValueError("HtmlTreeBuilder builds plain trees: no element_classes, no parse_only")
        cached = next(iter(self._fields_by_name.values()), None)
        if cached is not None and cached["parser_class"] is not type(soup):
            self._fields_by_name.clear()

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
                _take_apart(self.soup)
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
        soup = self.soup
        assert soup is not None  # set by the BeautifulSoup that feeds us
        if soup.current_data:
            self._end_string()
        # The budget costs one addition and two comparisons a tag (the soup is at the stack's bottom).
        stack = soup.tagStack
        nodes = self._nodes = self._nodes + 1 + len(attrib)
        if nodes >= self._checkpoint or len(stack) > self._max_depth:
            self._check_budget(len(stack))
        if attrib:
            if "{" in "".join(attrib):  # <a {urn:x}href=...>: bs4 reads it as a namespaced href
                super().start(tag, attrib, nsmap or {})
                return
            attrs: Any = self.attribute_dict_class(attrib)  # a copy: lxml may hand over a read-only mapping
            if self.cdata_list_attributes:
                attrs = self._replace_cdata_list_attribute_values(tag, attrs)
        else:
            attrs = self.attribute_dict_class()
        parent: Any = soup.currentTag  # the soup itself at the least
        previous = soup._most_recent_element
        siblings = parent.contents
        element = _new_tag(Tag)
        fields = element.__dict__
        fields.update(self._fields_by_name.get(tag) or self._fields_for(tag))
        fields["name"] = tag
        fields["attrs"] = attrs
        fields["contents"] = []
        fields["parent"] = parent
        fields["previous_element"] = previous
        fields["previous_sibling"] = siblings[-1] if siblings else None
        if previous is not None:
            previous.next_element = element
        if siblings:
            siblings[-1].next_sibling = element
        siblings.append(element)
        if tag == "meta":  # <meta charset> and its http-equiv form get a placeholder value
            self.set_up_substitutions(element)
        soup._most_recent_element = element
        stack.append(element)
        soup.currentTag = element
        soup.open_tag_counter[tag] += 1
        self._push_on_special_stacks(soup, element, tag)

    def _push_on_special_stacks(self, soup: Any, element: Tag, tag: str) -> None:
        """<pre>-like tags and string containers (<script>, <style>, ...) have stacks of their own."""
        if tag in self.preserve_whitespace_tags:
            soup.preserve_whitespace_tag_stack.append(element)
        if tag in self.string_containers:
            soup.string_container_stack.append(element)

    def _fields_for(self, name: str) -> dict[str, Any]:
        """The fields Tag.__init__ gives every tag of this name (the sets are shared between
        tags: bs4 only reads them)."""
        assert self.soup is not None
        string_class = self.string_containers.get(name)
        fields = {
            "parser_class": type(self.soup),
            "namespace": None,
            "_namespaces": self.active_namespace_prefixes[-1],
            "prefix": None,
            "sourceline": None,
            "sourcepos": None,
            "attribute_value_list_class": self.attribute_value_list_class,
            "known_xml": self.is_xml,
            "next_element": None,
            "next_sibling": None,
            "hidden": False,
            "can_be_empty_element": self.can_be_empty_element(name),
            "cdata_list_attributes": self.cdata_list_attributes,
            "preserve_whitespace_tags": self.preserve_whitespace_tags,
            "interesting_string_types": {string_class} if string_class else Tag.MAIN_CONTENT_STRING_TYPES,
        }
        self._fields_by_name[name] = fields
        return fields

    def end(self, tag: Any) -> None:
        soup = self.soup
        assert soup is not None
        if soup.current_data:
            self._end_string()
        stack = soup.tagStack
        current = stack[-1]
        if current.name != tag or current.prefix is not None:
            soup._popToTag(tag)  # lxml closes tags innermost first, so this is rare
            return
        stack.pop()
        soup.open_tag_counter[tag] -= 1
        if soup.preserve_whitespace_tag_stack and soup.preserve_whitespace_tag_stack[-1] is current:
            soup.preserve_whitespace_tag_stack.pop()
        if soup.string_container_stack and soup.string_container_stack[-1] is current:
            soup.string_container_stack.pop()
        soup.currentTag = stack[-1]

    def data(self, data: Any) -> None:
        assert self.soup is not None
        self.soup.current_data.append(data)

    def _end_string(self) -> None:
        """BeautifulSoup.endData for the text between two tags."""
        soup = self.soup
        assert soup is not None
        nodes = self._nodes = self._nodes + 1
        if nodes >= self._checkpoint:
            self._check_budget()
        text = "".join(soup.current_data)
        soup.current_data = []
        if not soup.preserve_whitespace_tag_stack and not text.strip(_ASCII_SPACES):
            text = "\n" if "\n" in text else " "
        string_class = NavigableString
        if soup.string_container_stack:  # text of a <script>, <style>, <template>, <rt> or <rp>
            string_class = self.string_containers.get(soup.string_container_stack[-1].name, NavigableString)
        parent: Any = soup.currentTag
        previous = soup._most_recent_element
        siblings = parent.contents
        string = _new_string(string_class, text)
        string.__dict__.update(
            hidden=False,
            parent=parent,
            previous_element=previous,
            next_element=None,
            previous_sibling=siblings[-1] if siblings else None,
            next_sibling=None,
        )
        if previous is not None:
            previous.next_element = string
        if siblings:
            siblings[-1].next_sibling = string
        siblings.append(string)
        soup._most_recent_element = string
