"""Every field and header of a task is checked, with bounds, where it is decoded."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from shared.errors import DecodeError, InvalidMessage
from shared.message_bounds import (
    BODY_BYTES_HEADER,
    BODY_EXCERPT_BYTES,
    BODY_SHA256_HEADER,
    MAX_TASK_BYTES,
    bounded_body,
)
from shared.messages import (
    ATTEMPT_HEADER,
    ERROR_HEADER,
    FIRST_FAILURE_HEADER,
    REASON_HEADER,
    REPLAY_HEADER,
    STATUS_HEADER,
    WORKER_HEADER,
    CrawlTask,
    Failure,
    Progress,
)

GOOD: dict[str, Any] = {
    "url": "http://a.test/p",
    "run_id": "run-1",
    "queue": "bulk",
    "priority": 0,
    "lastmod": "2024-01-01",
    "changefreq": "daily",
    "sitemap_priority": 0.5,
    "source": "http://a.test/sitemap.xml",
    "enqueued_at": 1_700_000_000.5,
    "recrawl_of": None,
}


def body_with(**changes: Any) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_a_good_body_decodes() -> None:
    assert CrawlTask.decode(body_with()) == CrawlTask(**GOOD)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", "r" * 20_000),
        ("run_id", "r" * 65),
        ("run_id", "a b"),
        ("run_id", "run/1"),
        ("run_id", ""),
        ("run_id", 7),
        ("url", "http://a.test/" + "p" * 2048),
        ("url", ""),
        ("url", ["http://a.test/"]),
        ("url", None),
        ("url", "http://a.test/\ud800"),
        ("url", "http://a.test/\x00"),
        ("url", "http://a.test/a b"),
        ("url", "http://a.test/é"),
        ("source", "lone \udc00"),
        ("queue", "elsewhere"),
        ("queue", 1),
        ("priority", 10**18),
        ("priority", -1),
        ("priority", 256),
        ("priority", True),
        ("priority", 1.5),
        ("priority", "1"),
        ("lastmod", 2),
        ("lastmod", "x" * 65),
        ("changefreq", {"a": 1}),
        ("sitemap_priority", 2),
        ("sitemap_priority", -0.1),
        ("sitemap_priority", True),
        ("sitemap_priority", "0.5"),
        ("source", "s" * 5000),
        ("source", None),
        ("enqueued_at", "soon"),
        ("enqueued_at", -1),
        ("enqueued_at", 10**18),
        ("enqueued_at", False),
        ("recrawl_of", "r" * 100),
        ("recrawl_of", 5),
    ],
)
def test_a_field_out_of_bounds_is_an_invalid_message(field: str, value: Any) -> None:
    with pytest.raises(InvalidMessage) as caught:
        CrawlTask.decode(body_with(**{field: value}))
    assert caught.value.reason == "invalid_message"
    assert repr(field) in caught.value.detail
    assert len(caught.value.detail) < 200  # names the problem without repeating the value


def test_special_floats_are_refused() -> None:
    for value in ("NaN", "Infinity", "-Infinity"):
        body = body_with().replace(b'"sitemap_priority": 0.5', f'"sitemap_priority": {value}'.encode())
        with pytest.raises(InvalidMessage):
            CrawlTask.decode(body)


def test_a_body_longer_than_any_task_is_refused_before_parsing() -> None:
    body = body_with(source="") + b" " * MAX_TASK_BYTES
    with pytest.raises(InvalidMessage, match="bytes"):
        CrawlTask.decode(body)


def test_missing_optional_fields_take_their_defaults() -> None:
    task = CrawlTask.decode(b'{"url": "http://a.test/", "run_id": "r", "queue": "ttl"}')
    assert (task.priority, task.source, task.lastmod, task.recrawl_of) == (0, "", None, None)
    assert task.enqueued_at > 0


@pytest.mark.parametrize(
    "headers",
    [
        {ATTEMPT_HEADER: 10**18},
        {ATTEMPT_HEADER: -1000},
        {ATTEMPT_HEADER: True},
        {ATTEMPT_HEADER: "2"},
        {ATTEMPT_HEADER: 2.0},
        {REPLAY_HEADER: 10**6},
        {REPLAY_HEADER: b"1"},
        {FIRST_FAILURE_HEADER: "yesterday"},
        {FIRST_FAILURE_HEADER: -5},
        {FIRST_FAILURE_HEADER: 10**15},
    ],
)
def test_a_header_out_of_bounds_is_refused_when_strict_and_absent_otherwise(headers: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessage) as caught:
        Progress.from_headers(headers, strict=True)
    assert next(iter(headers)) in caught.value.detail
    assert Progress.from_headers(headers) == Progress()


def test_counts_in_range_are_read() -> None:
    headers = {ATTEMPT_HEADER: 2, REPLAY_HEADER: 1, FIRST_FAILURE_HEADER: 1_700_000_000}
    assert Progress.from_headers(headers, strict=True) == Progress(2, 1, 1_700_000_000.0)
    assert Progress.from_headers(None, strict=True) == Progress()


def test_failure_headers_are_cut_to_their_bounds() -> None:
    failure = Failure.from_headers(
        {
            REASON_HEADER: b"r" * 1_000_000,
            ERROR_HEADER: "e" * 1_000_000,
            STATUS_HEADER: 10**18,
            WORKER_HEADER: 5,
        }
    )
    assert failure is not None
    assert (len(failure.reason), len(failure.error), failure.http_status, failure.worker_id) == (
        64,
        2000,
        None,
        "",
    )


def test_a_short_body_is_dead_lettered_whole() -> None:
    body = body_with()
    assert bounded_body(body) == (body, {})


def test_a_long_body_is_dead_lettered_as_an_excerpt_with_its_size_and_hash() -> None:
    body = b"\xff" * 50_000_000
    excerpt, headers = bounded_body(body)
    assert excerpt == body[:BODY_EXCERPT_BYTES]
    assert headers == {BODY_BYTES_HEADER: 50_000_000, BODY_SHA256_HEADER: hashlib.sha256(body).hexdigest()}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


@hypothesis_settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(sorted(GOOD)), json_values, max_size=10), st.binary(max_size=64))
def test_any_body_decodes_or_raises_decode_error(fields: dict[str, Any], noise: bytes) -> None:
    """Whatever arrives, decoding either gives a task within bounds or raises DecodeError."""
    for body in (json.dumps({**GOOD, **fields}).encode(), noise):
        try:
            task = CrawlTask.decode(body)
        except DecodeError:
            continue
        assert len(task.url) <= 2048 and len(task.run_id) <= 64 and 0 <= task.priority <= 255
