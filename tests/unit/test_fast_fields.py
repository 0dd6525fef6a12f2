"""The fast path (worker/parse/fast_fields.py, lxml's tree) stores exactly what the BeautifulSoup path
stores: every field of every page, on the demo site, generated pages, awkward markup and, when
it is downloaded (`python -m bench.real_corpus`), every page of the real corpus."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.perf_site import page_html
from bench.real_corpus import PACKAGE, downloaded, page_paths
from demo_site.config import Kind, SiteConfig
from demo_site.pages import render_page
from shared.errors import PermanentError
from worker.parse.budget import ParseBudget
from worker.parse.page import ParsedPage, decode_html, parse_page

BASE = "http://127.0.0.2:8000/docs/library/page.html"


def both_ways(html: str, base: str = BASE, budget: ParseBudget | None = None) -> tuple[object, object]:
    def one(fast: bool) -> ParsedPage | str:
        try:
            if budget is None:
                return parse_page(html, base, fast=fast)
            return parse_page(html, base, fast=fast, budget=budget)
        except PermanentError as exc:
            return f"refused: {exc}"

    return one(False), one(True)


def assert_same(html: str, base: str = BASE, budget: ParseBudget | None = None) -> None:
    reference, fast = both_ways(html, base, budget)
    assert fast == reference


AWKWARD = [
    # Strings under script, style, template, rt and rp are not text, nor part of get_text().
    "<html><body><h1>a<script>x</script>b<rt>ruby</rt><rp>(</rp>c</h1><p>d<rt>e<b>f</b></rt>g</p></body></html>",
    "<body><template><p>hidden <a href='/t'>t</a></p></template>shown<noscript>ns</noscript></body>",
    # A title inside an SVG is not the page's title; the first one outside is.
    "<html><head></head><body><svg><title>drawing</title></svg><title>Real</title>x</body></html>",
    # Comments and processing instructions split strings but add no text.
    "<body>a<!-- c -->b<?pi x?>c<p>d<!--e-->f</p>g</body>",
    "<!-- before --><!doctype html><html><body>x</body></html><!-- after -->",
    # Whitespace-only strings, nested tails, entities.
    "<body>\n  <div> <p>one</p>\n<p>two &amp; three&nbsp;four</p> </div>\n</body>",
    # No body: the text comes from the whole document (the bs4 path decides).
    "<html><head><title>t</title></head></html>",
    "<title>only a title</title>",
    "just text",
    "",
    # Fields and their first occurrence.
    '<html lang=" fr "><head><meta name="Description" content="  a  b "><link rel="x Canonical" '
    'href="/c"><base href="http://127.0.0.3/b/"></head><body><h1> one </h1><h1>two</h1>'
    '<a href="x.html#f">1</a><a href="../y.html">2</a><area href="/z"><a href="mailto:a@b">m</a>'
    '<a href="x.html">again</a></body></html>',
    # Malformed nesting that lxml repairs.
    "<body><p>a<div>b</p>c</div><table><tr>x<td>y</table><h1>u<h1>v</body>",
]


@pytest.mark.parametrize("html", AWKWARD)
def test_awkward_markup(html: str) -> None:
    assert_same(html)


def test_the_comparison_sees_a_difference() -> None:
    reference, fast = both_ways("<body><p>a</p></body>")
    assert reference == fast
    assert both_ways("<body><p>a</p></body>")[0] != both_ways("<body><p>b</p></body>")[1]


def test_demo_site_pages() -> None:
    config = SiteConfig()
    compared = 0
    for kind in Kind:
        for number in range(1, 6):
            html = decode_html(render_page(config, 0, kind, number))
            assert_same(html, f"http://127.0.0.2:8000/{kind.value}/{number}.html")
            compared += 1
    assert compared == 5 * len(Kind)


def test_synthetic_bench_pages() -> None:
    for n in range(50):
        assert_same(page_html("http://127.0.1.1:8531", n, 1000).decode(), f"http://127.0.1.1:8531/p/{n}.html")


def test_pages_near_the_budget_are_refused_the_same_way() -> None:
    budget = ParseBudget(max_nodes=200, max_depth=20)
    assert_same("<body>" + "<p>x</p>" * 150 + "</body>", budget=budget)  # over: parse_limit
    assert_same("<body>" + "<div>" * 30 + "x</body>", budget=budget)  # too deep
    assert_same("<body>" + "<p>x</p>" * 30 + "</body>", budget=budget)  # well within


def test_nesting_past_libxml2s_own_tree_limit() -> None:
    deep = "<body>" + "<div>" * 300 + '<a href="/deep">deep</a>' + "</div>" * 300 + "after</body>"
    assert_same(deep, budget=ParseBudget(max_depth=1000))


TAGS = [
    "p",
    "div",
    "a",
    "h1",
    "title",
    "script",
    "style",
    "template",
    "rt",
    "rp",
    "svg",
    "body",
    "noscript",
    "b",
]
PIECES = st.one_of(
    st.builds(
        lambda tag, href: f'<{tag} href="{href}">', st.sampled_from(TAGS), st.sampled_from(["/a", "b#c", " "])
    ),
    st.builds(lambda tag: f"</{tag}>", st.sampled_from(TAGS)),
    st.sampled_from(
        [
            "<!--c-->",
            "&amp;",
            " ",
            "\n",
            "<br>",
            "<?x?>",
            "<html lang=en>",
            "<meta name=description content=d>",
        ]
    ),
    st.text(alphabet="ab <>&;\n", max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=30).map("".join))
def test_generated_markup(html: str) -> None:
    assert_same(html)


def test_every_page_of_the_real_corpus() -> None:
    root = downloaded()
    if root is None:
        pytest.skip(f"the real corpus ({PACKAGE}) is not downloaded: run `python -m bench.real_corpus`")
    paths = page_paths(root)
    assert len(paths) > 100
    for path in paths:
        html = decode_html((root / path.lstrip("/")).read_bytes(), "text/html; charset=utf-8")
        reference, fast = both_ways(html, f"http://127.0.1.1:8531{path}")
        assert fast == reference, path
