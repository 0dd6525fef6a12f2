"""HtmlTreeBuilder (worker/parse/bs4_fastpath.py) builds the tree BeautifulSoup's own lxml builder
builds, field for field; so does new_soup on either path; and the check that decides between
them turns the fast one off when it would not."""

from __future__ import annotations

from typing import Any

import bs4
import pytest
from bs4 import BeautifulSoup, Tag
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from bench.perf_site import page_html
from tests.unit.test_parse import FULL
from worker.parse import bs4_fastpath
from worker.parse.bs4_fastpath import HtmlTreeBuilder, anatomy
from worker.parse.html_builder import BudgetedTreeBuilder
from worker.parse.soup import new_soup

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


def assert_same_tree(markup: str) -> None:
    stock = anatomy(BeautifulSoup(markup, "lxml"))
    assert anatomy(BeautifulSoup(markup, builder=HtmlTreeBuilder())) == stock
    assert anatomy(BeautifulSoup(markup, builder=BudgetedTreeBuilder())) == stock
    assert anatomy(new_soup(markup)) == stock
    assert anatomy(new_soup(markup, private_api=False)) == stock
    stock_single_valued = anatomy(BeautifulSoup(markup, "lxml", multi_valued_attributes=None))
    assert anatomy(new_soup(markup, multi_valued_attributes=False)) == stock_single_valued
    assert anatomy(new_soup(markup, multi_valued_attributes=False, private_api=False)) == stock_single_valued


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


def test_new_soup_takes_the_fast_path_where_its_check_passes_and_the_public_one_when_asked() -> None:
    assert bs4_fastpath.usable()  # the installed beautifulsoup4 is one it was checked on
    assert type(new_soup("<p>a</p>").builder) is HtmlTreeBuilder
    assert type(new_soup("<p>a</p>", private_api=False).builder) is BudgetedTreeBuilder


def test_the_check_passes_the_fast_builder_on_the_installed_bs4() -> None:
    assert bs4_fastpath.check(bs4.__version__, HtmlTreeBuilder) is None


@pytest.mark.parametrize("version", ["4.12.3", "4.16.0", "5.0", "not a version"])
def test_the_check_refuses_versions_it_was_not_checked_on(version: str) -> None:
    why = bs4_fastpath.check(version, HtmlTreeBuilder)
    assert why is not None and "outside the checked range >=4.13,<4.16" in why


class _ForgetsAField(HtmlTreeBuilder):
    """What a new bs4 field that Tag.__init__ sets, and the fast builder does not, looks like."""

    def start(self, tag: Any, attrib: Any, nsmap: Any = None) -> None:
        super().start(tag, attrib, nsmap)
        assert self.soup is not None
        del self.soup.currentTag.hidden


class _MissesAPrivatePart(HtmlTreeBuilder):
    """What a private method renamed in a new bs4 looks like."""

    def end(self, tag: Any) -> None:
        raise AttributeError("'BeautifulSoup' object has no attribute '_popToTag'")


def test_the_check_refuses_a_builder_whose_tree_differs_or_that_breaks() -> None:
    assert (
        bs4_fastpath.check(bs4.__version__, _ForgetsAField)
        == "its tree differs from bs4's own on a sample page"
    )
    why = bs4_fastpath.check(bs4.__version__, _MissesAPrivatePart)
    assert why is not None and "no attribute '_popToTag'" in why
