"""Both ways of building a page's tree (worker/parse/html_builder.py): bs4's private parts
(worker/parse/bs4_fastpath.py) and its public API. Same fields, same budget, node for node."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from bench.perf_site import page_html
from shared.errors import PermanentError
from tests.unit.test_html_builder import PIECES
from tests.unit.test_parse import FULL, PAGE_URL
from worker.parse import bs4_fastpath
from worker.parse.budget import ParseBudget
from worker.parse.page import ParsedPage, parse_page

DEFAULT = ParseBudget()
bounded = hypothesis_settings(max_examples=200, deadline=None, database=None, derandomize=True)

PAGES = [
    FULL,
    page_html("http://127.0.1.1:8531", 3, 250).decode(),
    "<html><head><base href='/b/'><title>x</title></head><body><a href='c'>c</a>",
    "<title>t</title>" + "<div>" * 40 + "<p>deep <a href='/d'>d</a></p>" + "</div>" * 40,
    "<!-- only a comment -->",
    "",
]


def both_ways(html: str, budget: ParseBudget = DEFAULT) -> tuple[object, object]:
    """What parse_page makes of `html` on each path: the page, or the refusal's reason and words."""

    def outcome(private_api: bool) -> ParsedPage | tuple[str, str]:
        try:
            return parse_page(html, PAGE_URL, budget=budget, private_api=private_api)
        except PermanentError as exc:
            return exc.reason, exc.detail

    return outcome(True), outcome(False)


def test_the_fast_path_is_the_one_in_use() -> None:
    assert bs4_fastpath.usable()


@pytest.mark.parametrize("html", PAGES)
def test_every_field_is_the_same_both_ways(html: str) -> None:
    fast, public = both_ways(html)
    assert isinstance(fast, ParsedPage)
    assert fast == public


@bounded
@given(st.lists(PIECES, max_size=30).map("".join))
def test_every_field_is_the_same_both_ways_on_generated_markup(html: str) -> None:
    fast, public = both_ways(html)
    assert fast == public


@pytest.mark.parametrize("html", PAGES[:4])
def test_the_node_budget_stops_both_ways_at_the_same_node(html: str) -> None:
    outcomes = [both_ways(html, ParseBudget(max_nodes=limit)) for limit in range(1, 400, 3)]
    assert all(fast == public for fast, public in outcomes)
    refused = [fast for fast, _ in outcomes if isinstance(fast, tuple)]
    assert refused and all(reason == "parse_limit" for reason, _ in refused)


def test_the_depth_budget_stops_both_ways_at_the_same_tag() -> None:
    outcomes = [both_ways(PAGES[3], ParseBudget(max_depth=depth)) for depth in range(40, 48)]
    assert all(fast == public for fast, public in outcomes)
    assert {type(fast) for fast, _ in outcomes} == {tuple, ParsedPage}  # refused below some depth


def test_a_stopped_public_parse_leaves_no_tree_for_the_garbage_collector() -> None:
    gc.collect()
    gc.disable()
    try:
        fast, public = both_ways("<p>x</p>" * 20_000, ParseBudget(max_nodes=20_000))
        assert public == fast == ("parse_limit", f"{PAGE_URL}: more than 20000 nodes")
        assert gc.collect() < 1_000
    finally:
        gc.enable()


@pytest.mark.parametrize("private_api", [True, False])
def test_a_finished_soup_parse_leaves_no_tree_for_the_garbage_collector(private_api: bool) -> None:
    # parse_page takes the soup apart, every node emptied, so reference counting frees the tree
    # at once. Left whole (or only soup.decompose()d), its 20,000 cyclic nodes wait for the collector.
    gc.collect()
    gc.disable()
    try:
        page = parse_page("<p>x</p>" * 10_000, PAGE_URL, fast=False, private_api=private_api)
        assert page.text.startswith("x x")
        assert gc.collect() < 1_000
    finally:
        gc.enable()
