"""BeautifulSoup's lxml HTML tree builder without the XML namespace bookkeeping.

bs4 gives its lxml HTML builder the start and end handlers of its XML builder, which look up
namespace maps and copy every attribute dict twice for each tag. lxml's HTML parser knows no
namespaces: it passes no namespace map, and a "{namespace}name" only where the markup spells
an attribute that way (which this builder leaves to the stock handler). Skipping the
bookkeeping builds the same tree (tests/unit/test_html_builder.py compares the two on
generated markup) in about a tenth less time, and building the tree is the largest single
cost of a page in a worker (docs/PERFORMANCE.md).
"""

from __future__ import annotations

from typing import Any

from bs4.builder._lxml import LXMLTreeBuilder


class HtmlTreeBuilder(LXMLTreeBuilder):
    """Use as BeautifulSoup(markup, builder=HtmlTreeBuilder()); it takes the builder's usual
    keyword arguments, such as multi_valued_attributes."""

    # lxml calls these with str names, whatever the markup's type.
    def start(self, tag: Any, attrib: Any, nsmap: Any = None) -> None:
        if attrib and "{" in "".join(attrib):  # <a {urn:x}href=...>: bs4 reads it as a namespaced href
            super().start(tag, attrib, nsmap or {})
            return
        assert self.soup is not None  # set by the BeautifulSoup that feeds us
        # The attribute dict is copied: lxml may hand over a read-only mapping.
        self.soup.handle_starttag(
            tag,
            None,
            None,
            self.attribute_dict_class(attrib),
            namespaces=self.active_namespace_prefixes[-1],
        )

    def end(self, tag: Any) -> None:
        assert self.soup is not None
        self.soup.handle_endtag(tag)  # which ends the text before it, as the stock end() does
