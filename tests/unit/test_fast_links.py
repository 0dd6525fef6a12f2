"""Relative links resolved through the per-directory cache (worker/parse/fast_links.py) come out as
urljoin makes them for the page's own URL."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.real_corpus import PACKAGE, downloaded, page_paths
from worker.parse.budget import ParseBudget
from worker.parse.fast_fields import scan_lxml
from worker.parse.fast_links import RelativeLinks, relative_key, split_base
from worker.parse.page import _absolute_http, _links, decode_html

BASES = [
    "http://127.0.0.2:8000/docs/library/os.html",
    "http://127.0.0.2:8000/docs/library/",
    "http://127.0.0.2:8000",
    "http://127.0.0.2:8000/a/b/c.html?q=1#frag",
    "https://127.0.0.3/a//b/./c/../d.html",
    "http://user@127.0.0.4:81/x%20y/z.html",
]
HREF_PARTS = st.sampled_from(
    ["..", ".", "a", "b.html", "", "%2e%2e", "x y", "é", "?q", "#f", "/", ";p", "\t", "..."]
)


def uncached(base: str, href: str) -> str | None:
    return _absolute_http(base, href)


def through_the_cache(base: str, href: str) -> str | None:
    split = split_base(base)
    key = relative_key(href)
    if split and key:
        return RelativeLinks(_absolute_http).resolve(*split, key)
    return uncached(base, href)


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize(
    "href", ["os.html", "../index.html#top", "./a/../b.html", "..", ".", "a//b.html", "x.html?v=1#y", "a/.."]
)
def test_known_relative_hrefs(base: str, href: str) -> None:
    assert relative_key(href) == href.partition("#")[0]
    assert through_the_cache(base, href) == uncached(base, href)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(BASES), st.lists(HREF_PARTS, min_size=1, max_size=6).map("/".join))
def test_generated_hrefs(base: str, href: str) -> None:
    assert through_the_cache(base, href) == uncached(base, href)


def test_what_is_not_relative_is_not_cached() -> None:
    for href in ["", "/a", "//h/a", "?q", "#f", "http://h/", "mailto:a@b", " a", "a:b", "\\a", "a;p", "#"]:
        assert relative_key(href) is None, href
    assert split_base("http://h:1/a/b.html") == ("http://h:1", "/a/")
    assert split_base("http://h:1/a;p/b.html") is None
    assert split_base("ftp://h/a") is None


def test_page_links_are_the_same_with_and_without_the_cache() -> None:
    base = BASES[0]
    hrefs = ["os.html", "../index.html", "os.html#x", "/abs.html", "#top", "mailto:a@b", "sub/"]
    expected = tuple(dict.fromkeys(u for h in hrefs if (u := uncached(base, h))))
    assert _links(hrefs, base, 1000) == expected
    assert _links(hrefs, base, 1000) == expected  # now from the cache


def test_every_link_of_the_real_corpus() -> None:
    root = downloaded()
    if root is None:
        pytest.skip(f"the real corpus ({PACKAGE}) is not downloaded: run `python -m bench.real_corpus`")
    compared = 0
    for path in page_paths(root)[:200]:
        scan = scan_lxml(decode_html((root / path.lstrip("/")).read_bytes()), ParseBudget())
        if scan is None:
            continue
        base = f"http://127.0.1.1:8531{path}"
        for href in dict.fromkeys(scan.hrefs):
            assert through_the_cache(base, href) == uncached(base, href), (path, href)
            compared += 1
    assert compared > 1000
