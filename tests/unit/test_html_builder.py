"""HtmlTreeBuilder builds the tree BeautifulSoup's own lxml builder builds, field for field."""

from __future__ import annotations

from typing import Any

import pytest
from bs4 import BeautifulSoup, Tag
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from bench.perf_site import page_html
from tests.unit.test_parse import FULL
from worker.html_builder import HtmlTreeBuilder, new_soup

pytestmark = pytest.mark.unit

bounded = hypothesis_settings(max_examples=300, deadline=None, database=None, derandomize=True)

TAGS = [
    "p",
    "a",
    "div",
    "svg",
    "use",
    "math",
    "title",
    "script",
    "style",
    "template",
    "pre",
    "textarea",
    "rt",
    "rp",
    "meta",
    "table",
    "td",
    "br",
    "x:y",
    "html",
    "body",
]
ATTRIBUTES = [
    "href",
    "class",
    "rel",
    "xlink:href",
    "xmlns",
    "xmlns:q",
    "{urn:x}href",
    "data-{a}",
    "lang",
    "charset",
    "http-equiv",
    "content",
]
VALUES = ["", "v", "a b", "&amp;", "<", "Content-Type", "text/html; charset=latin-1"]
PIECES = st.one_of(
    st.builds(
        lambda tag, attrs: "<" + tag + "".join(f' {name}="{value}"' for name, value in attrs) + ">",
        st.sampled_from(TAGS),
        st.lists(st.tuples(st.sampled_from(ATTRIBUTES), st.sampled_from(VALUES))),
    ),
    st.builds(lambda tag: f"</{tag}>", st.sampled_from(TAGS)),
    st.sampled_from(
        [
            "<!-- c -->",
            "<!-- \n -->",
            "<![CDATA[x]]>",
            "<?php x ?>",
            "<!DOCTYPE html>",
            "&nbsp;",
            "&x;",
            "<",
            " ",
            "\n\t",
        ]
    ),
    st.text(max_size=8),
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


def assert_same_tree(markup: str) -> None:
    assert anatomy(BeautifulSoup(markup, builder=HtmlTreeBuilder())) == anatomy(BeautifulSoup(markup, "lxml"))
    assert anatomy(new_soup(markup)) == anatomy(BeautifulSoup(markup, "lxml"))
    stock_single_valued = BeautifulSoup(markup, "lxml", multi_valued_attributes=None)
    assert anatomy(new_soup(markup, multi_valued_attributes=False)) == anatomy(stock_single_valued)


@pytest.mark.parametrize(
    "markup",
    [
        FULL,
        page_html("http://127.0.1.1:8531", 5, 250).decode(),
        '<svg xmlns="http://www.w3.org/2000/svg"><use xlink:href="#a"/></svg>',
        '<a {urn:x}href="/namespaced" xlink:href="b">t</a>',  # bs4 reads a namespaced href here
        "<?php echo 1 ?><!DOCTYPE html><p>a<!--c--><![CDATA[x]]>",
        "<pre>  </pre><textarea> \n</textarea><template><p> x </p></template><script> </script>"
        "<style>a</style><ruby>x<rt>y</rt><rp>(</rp></ruby><p>  </p>\n<p>\n</p>",
        '<meta charset="utf-8"><meta http-equiv="Content-Type" content="text/html; charset=x">'
        '<p class="a b" rel="x y">',
        "<table><tr><td>a<td>b</table></p></div>text after",
        "",
    ],
)
def test_same_tree_as_bs4s_builder(markup: str) -> None:
    assert_same_tree(markup)


@bounded
@given(st.lists(PIECES, max_size=30).map("".join))
def test_same_tree_as_bs4s_builder_on_generated_markup(markup: str) -> None:
    assert_same_tree(markup)


def test_the_comparison_sees_a_field_out_of_place() -> None:
    markup = '<p class="a">x <b>y</b></p>'
    soup = BeautifulSoup(markup, builder=HtmlTreeBuilder())
    bold = soup.find("b")
    assert isinstance(bold, Tag)
    bold.can_be_empty_element = True
    assert anatomy(soup) != anatomy(BeautifulSoup(markup, "lxml"))
    soup = BeautifulSoup(markup, builder=HtmlTreeBuilder())
    bold = soup.find("b")
    assert isinstance(bold, Tag)
    bold.contents[0].next_element = soup.p  # its one string
    assert anatomy(soup) != anatomy(BeautifulSoup(markup, "lxml"))


def test_one_builder_serves_parse_after_parse() -> None:
    builder = HtmlTreeBuilder()
    first = BeautifulSoup("<title>one</title><script>x</script>", builder=builder)
    second = BeautifulSoup("<p class='a b'>two</p>", builder=builder)
    assert anatomy(first) == anatomy(BeautifulSoup("<title>one</title><script>x</script>", "lxml"))
    assert anatomy(second) == anatomy(BeautifulSoup("<p class='a b'>two</p>", "lxml"))
    assert builder.soup is None  # it keeps no page alive between parses


class _BreaksOnBlink(HtmlTreeBuilder):
    def start(self, tag: Any, attrib: Any, nsmap: Any = None) -> None:
        if tag == "blink":
            raise RuntimeError("broken off")
        super().start(tag, attrib, nsmap)


def test_a_parse_broken_off_leaves_the_builder_usable() -> None:
    builder = _BreaksOnBlink()
    with pytest.raises(RuntimeError):
        BeautifulSoup("<p>a<blink>b</blink>", builder=builder)
    after = BeautifulSoup("<p>c</p>", builder=builder)
    assert anatomy(after) == anatomy(BeautifulSoup("<p>c</p>", "lxml"))


def test_options_it_does_not_build_are_refused() -> None:
    with pytest.raises(ValueError, match="parse_only"):
        BeautifulSoup("<p>a</p>", builder=HtmlTreeBuilder(), element_classes={Tag: type("T", (Tag,), {})})
