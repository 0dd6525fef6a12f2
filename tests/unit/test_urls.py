from __future__ import annotations

import random

import pytest

from shared.errors import PermanentError
from shared.urls import (
    InvalidURL,
    _canonicalize_in_full,
    _plain_canonical,
    canonicalize,
    domain_of,
    fingerprint,
)


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("HTTP://Example.COM/Path", "http://example.com/Path"),  # path case is kept
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),  # not the default for http
        ("http://example.com:8080", "http://example.com:8080/"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com/a#section", "http://example.com/a"),
        ("http://example.com/?b=2&a=1&a=0", "http://example.com/?a=0&a=1&b=2"),
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/%7euser", "http://example.com/~user"),
        ("http://example.com/a b".replace(" ", "%20"), "http://example.com/a%20b"),
        ("  http://example.com/x\n", "http://example.com/x"),  # surrounding whitespace ignored
        ("http://bücher.de/straße", "http://xn--bcher-kva.de/stra%C3%9Fe"),
        ("http://[::1]:80/x", "http://[::1]/x"),
        ("http://127.0.0.1:8000/x?q=1", "http://127.0.0.1:8000/x?q=1"),
    ],
)
def test_canonical_form(given: str, canonical: str) -> None:
    assert canonicalize(given) == canonical


def test_spellings_of_one_page_share_a_fingerprint() -> None:
    spellings = [
        "http://Example.com:80/p?b=2&a=1#top",
        "HTTP://example.COM/p?a=1&b=2",
        "http://example.com/x/../p?a=1&b=2",
    ]
    assert len({fingerprint(canonicalize(u)) for u in spellings}) == 1


@pytest.mark.parametrize(
    ("given", "detail"),
    [
        ("ftp://example.com/file", "scheme 'ftp' not http/https"),
        ("javascript:alert(1)", "scheme 'javascript' not http/https"),
        ("gopher://example.com/", "scheme (other) not http/https"),
        ("example.com/page", "no scheme (expected http:// or https://)"),
        ("http:///path", "no host"),
        ("http://user:secret@example.com/", "credentials in URL"),
        ("http://user@example.com/", "credentials in URL"),
        ("http://exa mple.com/", "contains whitespace or control characters"),
        ("http://example.com/a\tb", "contains whitespace or control characters"),
        ("http://example.com/\x00", "contains whitespace or control characters"),
        ("http://example.com/" + "a" * 2048, "longer than 2048 characters"),
        ("http://example.com:99999/", "invalid port"),
        ("http://example.com:port/", "invalid port"),
        ("http://[::1/", "cannot be parsed (malformed host)"),
        ("http://a..b/", "invalid host"),
        ("http://%41%42/", "invalid host"),
        ("", "empty"),
    ],
)
def test_invalid_urls_say_why(given: str, detail: str) -> None:
    with pytest.raises(InvalidURL) as caught:
        canonicalize(given)
    assert caught.value.reason == "invalid_url"
    assert caught.value.detail == detail
    assert isinstance(caught.value, PermanentError)


def test_url_within_limit_is_accepted_and_one_over_is_not() -> None:
    base = "http://example.com/"
    assert canonicalize(base + "a" * (2048 - len(base))).endswith("a")
    with pytest.raises(InvalidURL):
        canonicalize(base + "a" * (2049 - len(base)))


def test_arbitrary_text_raises_nothing_but_invalid_url() -> None:
    rng = random.Random(20240601)
    alphabet = "hts:/[]@%#?&=.:-_ aAé\x00\u3000\ufffd0189xn-" + "\U0001f600"
    accepted = 0
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.7:
            text = rng.choice(["http://", "https://", "HTTP://"]) + text
        try:
            result = canonicalize(text)
        except InvalidURL:
            continue
        accepted += 1
        assert canonicalize(result) == result  # canonical forms are stable
        assert domain_of(result)
    assert accepted > 0  # the generator does produce some valid URLs


def test_the_shortcut_for_plain_urls_agrees_with_the_full_way() -> None:
    """`canonicalize` skips w3lib for URLs that look canonical already; on URLs made of the
    shortcut's own characters (and a few it must hand on), both ways give the same answer."""
    rng = random.Random(20261126)
    hosts = ["127.0.1.7", "127.1", "01.2.3.4", "256.1.1.1", "a.0x1", "a.1", "1a.b", "x--y.test", "xn--abc"]
    ports = ["", ":80", ":443", ":8080", ":080", ":1", ":65535", ":65536", ":99999"]
    segments = [".", "..", "...", "a.", ".a", "~u", "A-Z_0", "", "%41", "p.html"]

    def label() -> str:
        return "".join(rng.choice("ab0-") for _ in range(rng.randint(0, 4)))

    taken = 0
    for _ in range(20_000):
        named = ".".join(label() for _ in range(rng.randint(1, 3)))
        host = rng.choice(hosts) if rng.random() < 0.3 else named
        path = "/".join(rng.choice(segments) for _ in range(rng.randint(0, 4)))
        url = f"{rng.choice(['http', 'https', 'HTTP'])}://{host}{rng.choice(ports)}"
        url += rng.choice(["", "/" + path, "/" + path + rng.choice(["", "?b=1&a=2", "#f", "?"])])
        plain = _plain_canonical(url)
        if plain is None:
            continue
        taken += 1
        assert plain == _canonicalize_in_full(url), url
    assert taken > 1_000  # the shortcut is taken often enough for this to mean something


def test_fingerprint_is_ten_bytes_and_distinguishes_urls() -> None:
    first = fingerprint("http://example.com/a")
    assert len(first) == 10
    assert first == fingerprint("http://example.com/a")
    assert first != fingerprint("http://example.com/b")


@pytest.mark.parametrize(
    ("url", "domain"),
    [
        ("http://Example.com/x", "example.com"),
        ("http://example.com:80/x", "example.com"),
        ("https://example.com:443/x", "example.com"),
        ("http://example.com:8080/x", "example.com:8080"),
        ("https://example.com:80/x", "example.com:80"),
        ("http://[::1]:8000/", "[::1]:8000"),
    ],
)
def test_domain_of(url: str, domain: str) -> None:
    assert domain_of(url) == domain


def test_domain_of_a_non_url_is_invalid() -> None:
    with pytest.raises(InvalidURL):
        domain_of("not a url")
