"""HtmlTreeBuilder builds the tree BeautifulSoup's own lxml builder builds, on any markup."""

from __future__ import annotations

import pytest
from bs4 import BeautifulSoup
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from bench.perf_site import page_html
from tests.unit.test_parse import FULL
from worker.html_builder import HtmlTreeBuilder

pytestmark = pytest.mark.unit

bounded = hypothesis_settings(max_examples=300, deadline=None, database=None, derandomize=True)

TAGS = ["p", "a", "div", "svg", "use", "math", "title", "script", "style", "table", "td", "br", "x:y", "html"]
ATTRIBUTES = ["href", "class", "rel", "xlink:href", "xmlns", "xmlns:q", "{urn:x}href", "data-{a}", "lang"]
PIECES = st.one_of(
    st.builds(
        lambda tag, attrs: "<" + tag + "".join(f' {name}="{value}"' for name, value in attrs) + ">",
        st.sampled_from(TAGS),
        st.lists(st.tuples(st.sampled_from(ATTRIBUTES), st.sampled_from(["", "v", "a b", "&amp;", "<"]))),
    ),
    st.builds(lambda tag: f"</{tag}>", st.sampled_from(TAGS)),
    st.sampled_from(["<!-- c -->", "<![CDATA[x]]>", "<?php x ?>", "<!DOCTYPE html>", "&nbsp;", "&x;", "<"]),
    st.text(max_size=8),
)


def tree(soup: BeautifulSoup) -> tuple[str, list[tuple[str, list[tuple[str, type]]]]]:
    return soup.decode(), [
        (tag.name, [(str(name), type(name)) for name in tag.attrs]) for tag in soup.find_all(True)
    ]


def same_tree(markup: str) -> None:
    assert tree(BeautifulSoup(markup, builder=HtmlTreeBuilder())) == tree(BeautifulSoup(markup, "lxml"))
    stock_single_valued = BeautifulSoup(markup, "lxml", multi_valued_attributes=None).decode()
    ours = BeautifulSoup(markup, builder=HtmlTreeBuilder(multi_valued_attributes=None)).decode()
    assert ours == stock_single_valued


@pytest.mark.parametrize(
    "markup",
    [
        FULL,
        page_html("http://127.0.1.1:8531", 5, 250).decode(),
        '<svg xmlns="http://www.w3.org/2000/svg"><use xlink:href="#a"/></svg>',
        '<a {urn:x}href="/namespaced" xlink:href="b">t</a>',  # bs4 reads a namespaced href here
        "<?php echo 1 ?><!DOCTYPE html><p>a<!--c--><![CDATA[x]]>",
        "",
    ],
)
def test_same_tree_as_bs4s_builder(markup: str) -> None:
    same_tree(markup)


@bounded
@given(st.lists(PIECES, max_size=30).map("".join))
def test_same_tree_as_bs4s_builder_on_generated_markup(markup: str) -> None:
    same_tree(markup)
