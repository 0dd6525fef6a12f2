"""Crawl requests are checked before anything is queued: each refusal is one line naming the
field, and a request that passes goes through encode/decode unchanged."""

from __future__ import annotations

import json

import pytest

from ops.submit import Submitted, submit
from shared.crawl_request import MAX_REQUEST_BYTES, CrawlRequest, InvalidRequest, check
from shared.errors import BlockedAddress, DecodeError, InvalidMessage
from shared.settings import Settings

SITEMAP = "https://example.com/sitemap.xml"


class Published:
    """A fake control queue: what submit() would have published."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __call__(self, _settings: Settings, body: bytes) -> None:
        self.bodies.append(body)


def guard(url: str) -> None:
    """The address guard, faked: 10.x and 127.x are refused."""
    if "//10." in url or "//127." in url:
        raise BlockedAddress(f"{url.split('/')[2]} is private")


def submitted(body: bytes | dict[str, object]) -> tuple[Submitted, list[bytes]]:
    published = Published()
    answer = submit(Settings(), body, guard=guard, publish=published)
    return answer, published.bodies


def refusal(body: bytes | dict[str, object]) -> str:
    published = Published()
    with pytest.raises(InvalidRequest) as caught:
        submit(Settings(), body, guard=guard, publish=published)
    assert published.bodies == [], "a refused request was queued"
    text = str(caught.value)
    assert "\n" not in text and len(text) < 400
    return text


def test_a_good_request_is_queued_once_as_it_was_given() -> None:
    body = {
        "run_id": "demo-2",
        "sitemaps": [SITEMAP],
        "urls": ["https://example.com/a"],
        "site": "https://b.test/",
    }
    answer, bodies = submitted(json.dumps(body).encode())
    assert answer.run_id == "demo-2" and answer.operation.startswith("req-")
    [queued] = bodies
    request = CrawlRequest.decode(queued)
    assert (request.run_id, request.sitemaps, request.urls, request.sites) == (
        "demo-2",
        (SITEMAP,),
        ("https://example.com/a",),
        ("https://b.test/",),
    )
    assert request.request_id == answer.operation and request.recrawl_of is None


def test_a_request_without_a_run_id_gets_a_new_one() -> None:
    first, _ = submitted({"sitemaps": [SITEMAP]})
    second, _ = submitted({"sitemaps": [SITEMAP], "recrawl_of": "demo-1"})
    assert first.run_id != second.run_id and len(first.run_id) > 10


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, "no URL: give at least one of sitemaps, urls, site or start_urls"),
        ({"sitemaps": []}, "no URL"),
        ({"urls": ["not a url"]}, "urls[0] 'not a url': "),
        (
            {"sitemaps": [SITEMAP, "ftp://example.com/s.xml"]},
            "sitemaps[1] 'ftp://example.com/s.xml': scheme 'ftp'",
        ),
        ({"urls": ["javascript:alert(1)"]}, "scheme 'javascript' not http/https"),
        ({"site": "http://10.1.2.3/"}, "sites[0] 'http://10.1.2.3/': blocked address: 10.1.2.3"),
        (
            {"urls": ["https://example.com/", "http://127.0.0.1:8080/x"]},
            "urls[1] 'http://127.0.0.1:8080/x': blocked",
        ),
        ({"sitemaps": [SITEMAP], "run_id": "x" * 65}, "run_id: use up to 64 letters"),
        (
            {"sitemaps": [SITEMAP], "run_id": "a/b"},
            "run_id: use up to 64 letters, digits, '.', '-' or '_', got 'a/b'",
        ),
        ({"sitemaps": [SITEMAP], "run_id": 7}, "got int"),
        ({"sitemaps": [SITEMAP], "recrawl_of": "../x"}, "recrawl_of: use up to 64"),
        ({"sitemaps": SITEMAP}, None),  # one URL for a list is taken as a list of one
        ({"sitemaps": [1]}, "sitemaps: expected a list of URLs"),
        ({"sitemaps": [SITEMAP], "settings": {"X": 1}}, "'settings': not a field of a crawl request"),
        ({"sitemaps": [SITEMAP], "url_files": ["/etc/passwd"]}, "'url_files': not a field"),
    ],
)
def test_bad_requests_are_refused_with_one_line(body: dict[str, object], expected: str | None) -> None:
    if expected is None:
        submitted(body)
        return
    assert expected in refusal(body)


def test_bodies_that_are_not_a_json_object_or_too_big_are_refused() -> None:
    assert refusal(b"{not json") == "body is not JSON (JSONDecodeError)"
    assert refusal(b"[1, 2]") == "body is not a JSON object"
    assert refusal(b"\xff\xfe").startswith("body is not JSON (")
    big = json.dumps({"urls": [f"https://example.com/{n:08d}" for n in range(40_000)]}).encode()
    assert len(big) > MAX_REQUEST_BYTES
    assert (
        refusal(big) == f"request body of {len(big)} bytes, over the {MAX_REQUEST_BYTES} a request may have"
    )
    assert "over the" in refusal({"urls": [f"https://example.com/{n:08d}" for n in range(40_000)]})


def test_a_long_url_is_shown_cut_in_the_error() -> None:
    text = refusal({"urls": ["https://example.com/" + "a b" * 3000]})
    assert text.startswith("urls[0] 'https://example.com/") and "...'" in text and len(text) < 400


def test_what_the_service_decodes_is_bounded_too() -> None:
    request = CrawlRequest(run_id="r", urls=("https://example.com/",))
    assert CrawlRequest.decode(request.encode()) == request
    with pytest.raises(DecodeError):
        CrawlRequest.decode(b"\x00garbage")
    tampered = json.loads(request.encode())
    tampered["run_id"] = "../../etc"
    with pytest.raises(InvalidMessage, match="run_id"):
        CrawlRequest.decode(json.dumps(tampered).encode())
    tampered = {**json.loads(request.encode()), "routing_file": "/etc/shadow"}
    with pytest.raises(InvalidMessage, match="routing_file"):
        CrawlRequest.decode(json.dumps(tampered).encode())
    with pytest.raises(InvalidRequest, match="blocked address"):
        check(CrawlRequest(run_id="r", sitemaps=("http://10.0.0.1/s.xml",)), guard)
