"""BeautifulSoup's tree for an HTML page, built from lxml's parse at a third of the cost, by
setting bs4's private fields directly: used by worker/parse/html_builder.py where `usable()`.

bs4's lxml builder spends about 10 us a node in Python: every tag goes through the XML
builder's namespace bookkeeping, `handle_starttag`, `Tag.__init__` (two dozen fields, each
decided by asking the builder) and `pushTag`, every string through `endData`,
`string_container` and `object_was_parsed`, and every end tag through `_popToTag`. Building
the tree was the largest single cost of a page in a worker (docs/PERFORMANCE.md).

`HtmlTreeBuilder` takes the same lxml events and builds the same objects, but sets each node's
fields in one step: the fields that depend only on the tag's name are worked out once per name
and copied in, and the links between nodes are set as bs4 would leave them once parsing is done.
What it does not speed up, it hands to bs4's own code: comments, doctypes, processing
instructions, namespaced attribute names, and end tags that do not close the innermost open tag.

The private parts of bs4 it relies on: Tag and NavigableString made without their __init__,
with every field set here; the soup's `_most_recent_element` and `_popToTag`; the builder's
`_replace_cdata_list_attribute_values`; and the soup's parse state (tagStack, currentTag,
open_tag_counter, the whitespace and string-container stacks). So `usable()` checks, once a
process: the installed beautifulsoup4 is in the range this was checked on, and on sample pages
the tree built here equals, field for field (`anatomy`), the one bs4's own builder builds. When
either fails, the public builder is used (the same trees, slower) and a warning says so once.
tests/unit/test_html_builder.py compares the two on fixed and generated markup.
"""

from __future__ import annotations

import functools
from typing import Any

import bs4
from bs4 import BeautifulSoup
from bs4.element import NavigableString, Tag

from shared.library_checks import outside, warn_fallback
from worker.parse.html_builder import LXML_HTML_BUILDER, BudgetedTreeBuilder

# Checked field by field on 4.13.x to 4.15.0 (pyproject.toml pins the same range).
CHECKED_VERSIONS = ((4, 13), (4, 16))

_new_tag = Tag.__new__
_new_string = str.__new__  # NavigableString.__new__ without its setup(), done here instead
_ASCII_SPACES = BeautifulSoup.ASCII_SPACES  # what bs4 collapses a blank string to one space of

# Pages the check builds both ways: each kind of node and each special case the builder has.
SAMPLE_PAGES = (
    "<!DOCTYPE html><html><head><meta charset='utf-8'><title>t</title>"
    "<meta http-equiv='Content-Type' content='text/html; charset=latin-1'>"
    "<link rel='canonical alternate' href='/c'><style>p {}</style><script> x </script></head>"
    "<body class='a b'><!-- c --><p id=p1>one <a href='/x' rel='next'>two</a> three</p>"
    "<pre>  </pre><textarea> \n</textarea><template><p> x </p></template>"
    "<ruby>x<rt>y</rt><rp>(</rp></ruby><table><tr><td>a<td>b</table></p></div>"
    "<svg xmlns='http://www.w3.org/2000/svg'><use xlink:href='#a'/></svg>"
    "<a {urn:x}href='/n'>n</a><?php x ?><br><img src=i.png alt=''>\n<p>\n</p>text after",
    "",
)

LINKS = ("parent", "previous_element", "next_element", "previous_sibling", "next_sibling")
# The soup's parse state, compared apart from its fields as a tag.
SOUP_STATE = (
    "builder",
    "markup",
    "tagStack",
    "currentTag",
    "_most_recent_element",
    "current_data",
    "open_tag_counter",
    "preserve_whitespace_tag_stack",
    "string_container_stack",
)


def anatomy(soup: BeautifulSoup) -> tuple[list[Any], Any]:
    """Every node's class, text and fields, with its links as positions in document order,
    and the soup's parse state: what two builders must agree on."""
    nodes = [soup, *soup.descendants]
    position = {id(node): index for index, node in enumerate(nodes)}

    def at(node: object) -> object:
        return None if node is None else position.get(id(node), "outside the tree")

    described = []
    for node in nodes:
        fields = {name: value for name, value in vars(node).items() if name not in LINKS + SOUP_STATE}
        if isinstance(node, Tag):
            fields["contents"] = [at(child) for child in node.contents]
            fields["attrs"] = [(type(k), str(k), type(v), v) for k, v in node.attrs.items()]
        text = None if isinstance(node, Tag) else str(node)
        described.append(
            (type(node), text, sorted(fields.items()), [at(getattr(node, link)) for link in LINKS])
        )
    state = (
        [at(tag) for tag in soup.tagStack],
        at(soup.currentTag),
        at(soup._most_recent_element),
        soup.current_data,
        {name: count for name, count in soup.open_tag_counter.items() if count},
        [at(tag) for tag in soup.preserve_whitespace_tag_stack],
        [at(tag) for tag in soup.string_container_stack],
    )
    return described, state


def check(version: str, builder_class: type[BudgetedTreeBuilder]) -> str | None:
    """Why `builder_class` may not stand in for bs4's own builder with beautifulsoup4 `version`,
    or None when it may."""
    why = outside(version, *CHECKED_VERSIONS)
    if why is not None:
        return why
    try:
        for page in SAMPLE_PAGES:
            for options in ({}, {"multi_valued_attributes": None}):
                ours = BeautifulSoup(page, builder=builder_class(**options))
                theirs = BeautifulSoup(page, builder=BudgetedTreeBuilder(**options))
                if anatomy(ours) != anatomy(theirs):
                    return "its tree differs from bs4's own on a sample page"
    except Exception as exc:  # a private part gone or changed shape
        return f"it failed on a sample page: {exc!r}"
    return None


@functools.cache
def usable() -> bool:
    """Whether HtmlTreeBuilder may be used (checked once a process)."""
    why = check(bs4.__version__, HtmlTreeBuilder)
    if why is not None:
        warn_fallback("bs4's fast tree builder", why, "bs4's own lxml builder, about three times slower")
    return why is None


class HtmlTreeBuilder(BudgetedTreeBuilder):
    """Use as BeautifulSoup(markup, builder=HtmlTreeBuilder()), with the builder's usual keyword
    arguments, where `usable()`. One instance serves one parse at a time: give each thread its own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._fields_by_name: dict[str, dict[str, Any]] = {}

    def initialize_soup(self, soup: BeautifulSoup) -> None:
        super().initialize_soup(soup)
        if soup.element_classes or soup.parse_only:
            raise ValueError("HtmlTreeBuilder builds plain trees: no element_classes, no parse_only")
        cached = next(iter(self._fields_by_name.values()), None)
        if cached is not None and cached["parser_class"] is not type(soup):
            self._fields_by_name.clear()

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
                LXML_HTML_BUILDER.start(self, tag, attrib, nsmap or {})  # bs4's own, counted above
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
