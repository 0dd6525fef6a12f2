"""The parse budget: nodes, depth and time a page may cost (worker/parse/html_builder.py, parse.py)."""

from __future__ import annotations

import gc

import pytest

from shared.errors import ConfigError, PermanentError
from shared.settings import Settings
from worker.fetch.fetcher import _read_body
from worker.parse.budget import ParseBudget, ParseLimitExceeded
from worker.parse.markup_scan import MarkupScan
from worker.parse.page import parse_budget, parse_page
from worker.parse.soup import new_soup

URL = "http://x.example/"


def refusal(html: str, budget: ParseBudget) -> str:
    with pytest.raises(PermanentError) as caught:
        parse_page(html, URL, budget=budget)
    assert caught.value.reason == "parse_limit"
    return caught.value.detail


def nested(depth: int) -> str:
    return "<div>" * depth + "<a href='/in'>in</a>" + "</div>" * depth


def test_nesting_up_to_the_depth_budget_is_read() -> None:
    # lxml adds <html> and <body> around the divs: 2 + 47 + the <a> make 50.
    page = parse_page(nested(47), URL, budget=ParseBudget(max_depth=50))
    assert page.links == ("http://x.example/in",)


def test_nesting_past_the_depth_budget_is_a_parse_limit() -> None:
    assert "nested deeper than 50 elements" in refusal(nested(48), ParseBudget(max_depth=50))


@pytest.mark.parametrize(
    ("what", "html"),
    [
        ("elements", "<p></p>" * 60),
        ("strings", "<b>x</b>y" * 40),
        ("attributes", "<p " + " ".join(f"a{i}=x" for i in range(100)) + ">"),
        ("comments", "<!-- c -->" * 100),
    ],
)
def test_every_kind_of_node_counts_against_the_node_budget(what: str, html: str) -> None:
    assert "more than 50 nodes" in refusal(html, ParseBudget(max_nodes=50)), what


def test_a_page_within_the_node_budget_is_read_whole() -> None:
    html = "<html><head><title>t</title></head><body>" + "<p><a href='/x'>x</a></p>" * 10 + "</body></html>"
    # html, head, title, "t", body, and 10 x (p, a, href, "x"): 45 nodes.
    page = parse_page(html, URL, budget=ParseBudget(max_nodes=45))
    assert page.title == "t" and page.links == ("http://x.example/x",)
    assert "more than 44 nodes" in refusal(html, ParseBudget(max_nodes=44))


def test_a_page_far_past_the_node_budget_is_refused_before_it_is_built() -> None:
    assert "over 800 '<' and '=', for at most 200 nodes" in refusal("<a>" * 801, ParseBudget(max_nodes=200))
    # At four '<' per node allowed it is left to the count made while building.
    assert "more than 200 nodes" in refusal("<a>" * 800, ParseBudget(max_nodes=200))


class SteppingClock:
    """Each reading is one second after the last."""

    def __init__(self) -> None:
        self.now = 0.0
        self.readings = 0

    def __call__(self) -> float:
        self.now += 1.0
        self.readings += 1
        return self.now


def test_a_parse_past_its_deadline_stops() -> None:
    clock = SteppingClock()
    html = "<p>x</p>" * 5_000  # 10,000 nodes: the clock is read every 1,024
    with pytest.raises(ParseLimitExceeded, match="took longer than 3 s"):
        new_soup(html, budget=ParseBudget(deadline_s=3.0), clock=clock)
    assert clock.readings == 5  # the start, then one every 1,024 nodes until past 3 s


def test_a_stopped_parse_leaves_no_tree_for_the_garbage_collector() -> None:
    # A part-built tree is cyclic: without being taken apart it waits in memory for a full
    # collection. Stopped at 20,000 nodes, what is left for the collector is a handful of objects.
    gc.collect()
    gc.disable()
    try:
        refusal("<p>x</p>" * 20_000, ParseBudget(max_nodes=20_000))
        assert gc.collect() < 1_000
    finally:
        gc.enable()


def test_the_builder_parses_the_next_page_after_a_refused_one() -> None:
    refusal("<p>x</p>" * 100, ParseBudget(max_nodes=50))
    refusal(nested(60), ParseBudget(max_depth=50))
    page = parse_page("<title>next</title><a href='/n'>n</a>", URL, budget=ParseBudget(max_nodes=50))
    assert page.title == "next" and page.links == ("http://x.example/n",)


def test_the_budget_comes_from_the_settings() -> None:
    settings = Settings.from_env({"PARSE_MAX_NODES": "7", "PARSE_MAX_DEPTH": "8", "PARSE_DEADLINE_S": "0.5"})
    assert parse_budget(settings) == ParseBudget(max_nodes=7, max_depth=8, deadline_s=0.5)
    assert parse_budget(Settings()) == ParseBudget()


@pytest.mark.parametrize(
    ("name", "value"), [("PARSE_MAX_NODES", "0"), ("PARSE_MAX_DEPTH", "-1"), ("PARSE_DEADLINE_S", "0")]
)
def test_a_budget_that_allows_nothing_is_a_config_error(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


class EndlessTags:
    """A response whose body is `<a>` without end, read as the fetcher reads it."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.raw = self
        self.bytes_read = 0

    def read1(self, size: int, decode_content: bool = True) -> bytes:
        chunk = b"<a>" * 1_000
        self.bytes_read += len(chunk)
        return chunk


def test_a_body_with_more_tags_than_the_budget_allows_is_refused_while_it_arrives() -> None:
    response = EndlessTags()
    with pytest.raises(PermanentError) as caught:
        _read_body(response, 10**9, float("inf"), URL, budget=ParseBudget(max_nodes=2_000))  # type: ignore[arg-type]
    assert caught.value.reason == "parse_limit"
    assert response.bytes_read == 27_000  # 9,000 '<': the first chunk past 8,000, not the byte cap

    assert "'<' and '='" in str(caught.value)


def test_without_a_tag_limit_only_the_byte_cap_ends_a_body() -> None:
    with pytest.raises(PermanentError) as caught:
        _read_body(EndlessTags(), 30_000, float("inf"), URL)  # type: ignore[arg-type]
    assert caught.value.reason == "too_large"


def test_a_tag_longer_than_the_budget_is_refused_before_lxml_gathers_its_attributes() -> None:
    # Tags are measured across the 64 K pieces text is scanned in, so the limit is well above that.
    attributes = " ".join(f"a{i}=x" for i in range(20_000))  # 168 KB in one tag
    budget = ParseBudget(max_tag_bytes=100_000)
    assert "a tag longer than 100000 characters" in refusal(f"<p {attributes}>x</p>", budget)
    # Long text between tags is no tag.
    assert parse_page("<p>" + "x" * 200_000 + "</p>", URL, budget=budget).text == "x" * 100_000


@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_a_tag_is_measured_across_the_pieces_it_arrives_in(piece: int) -> None:
    body = b"<html><body><p>text</p><img src='data:," + b"a" * 9_000 + b"'></body></html>"
    within, beyond = (
        MarkupScan(ParseBudget(max_tag_bytes=9_100)),
        MarkupScan(ParseBudget(max_tag_bytes=8_999)),
    )
    for start in range(0, len(body), piece):
        within.feed(body[start : start + piece])
    with pytest.raises(ParseLimitExceeded, match="a tag longer than 8999"):
        for start in range(0, len(body), piece):
            beyond.feed(body[start : start + piece])
    assert within.marks == 7 + 1  # the '<' of seven tags and the '=' of one attribute
