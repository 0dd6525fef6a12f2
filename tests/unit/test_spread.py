"""spread_hosts: one URL per host in turn, within a window, nothing lost or reordered within a host."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.sitemaps import SitemapEntry
from producer.spread import host_of, spread_hosts


def entries(*urls: str) -> list[SitemapEntry]:
    return [SitemapEntry(url, "test") for url in urls]


def urls(found: list[SitemapEntry]) -> list[str]:
    return [e.url for e in found]


def test_hosts_take_turns_and_keep_their_own_order() -> None:
    given_order = entries(
        "http://a.example/1",
        "http://a.example/2",
        "http://a.example/3",
        "http://b.example/1",
        "http://c.example/1",
    )
    assert urls(list(spread_hosts(given_order, window=100))) == [
        "http://a.example/1",
        "http://b.example/1",
        "http://c.example/1",
        "http://a.example/2",
        "http://a.example/3",
    ]


def test_turns_are_taken_within_each_window() -> None:
    given_order = entries(
        "http://a.example/1", "http://a.example/2", "http://b.example/1", "http://b.example/2"
    )
    # The first window holds only a's URLs; the second only b's.
    assert urls(list(spread_hosts(given_order, window=2))) == urls(given_order)
    assert urls(list(spread_hosts(given_order, window=4))) == [
        "http://a.example/1",
        "http://b.example/1",
        "http://a.example/2",
        "http://b.example/2",
    ]


def test_a_window_filling_slowly_is_let_go_after_the_hold_time() -> None:
    arrivals = iter([0.0, 0.1, 5.0, 5.1, 5.2])  # the third URL came after a slow fetch
    given_order = entries(
        "http://a.example/1",
        "http://a.example/2",
        "http://b.example/1",
        "http://b.example/2",
        "http://c.example/1",
    )
    spread = spread_hosts(given_order, window=100, max_hold_s=1.0, clock=lambda: next(arrivals))
    # The first window ends with b/1, which arrived 5 s after it began; the rest is the next window.
    assert urls(list(spread)) == [
        "http://a.example/1",
        "http://b.example/1",
        "http://a.example/2",
        "http://b.example/2",
        "http://c.example/1",
    ]


@pytest.mark.parametrize("window", [0, 1])
def test_a_window_of_one_or_less_keeps_the_order(window: int) -> None:
    given_order = entries("http://a.example/1", "http://a.example/2", "http://b.example/1")
    assert urls(list(spread_hosts(given_order, window=window))) == urls(given_order)


def test_host_names_are_compared_without_case_and_bad_urls_still_pass_through() -> None:
    assert host_of("http://A.Example:8080/x") == "a.example"
    assert host_of("http://[::1/") == ""  # malformed: canonicalisation rejects it later, with a reason
    given_order = entries("http://A.example/1", "http://a.example/2", "http://[::1/", "http://b.example/1")
    assert urls(list(spread_hosts(given_order, window=10))) == [
        "http://A.example/1",
        "http://[::1/",
        "http://b.example/1",
        "http://a.example/2",
    ]


@given(
    st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 50)), max_size=200),
    st.integers(0, 60),
)
def test_nothing_is_lost_or_reordered_within_a_host(pairs: list[tuple[str, int]], window: int) -> None:
    given_order = entries(*(f"http://{host}.example/{n}" for host, n in pairs))
    spread = list(spread_hosts(given_order, window=window))
    assert sorted(urls(spread)) == sorted(urls(given_order))
    for host in "abcde":
        assert [e for e in spread if host_of(e.url) == f"{host}.example"] == [
            e for e in given_order if host_of(e.url) == f"{host}.example"
        ]


@given(
    st.sampled_from(["http", "HTTPS", "ftp", "h2", ""]),
    st.sampled_from(["://", ":/", "", "://user@", "://[::1]"]),
    st.text(alphabet="aZ09.-_%:@[] \t\u00e9", max_size=12),
    st.sampled_from(["", "/p", "?q", "#f", ":8080/p", ":x/", "\t/p", " "]),
)
def test_the_host_is_what_urlsplit_makes_of_it(scheme: str, sep: str, host: str, rest: str) -> None:
    url = f"{scheme}{sep}{host}{rest}"
    try:
        expected = (urlsplit(url).hostname or "").lower()
    except ValueError:
        expected = ""
    assert host_of(url) == expected
