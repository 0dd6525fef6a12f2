"""The bounds of what a message may carry, checked where it is decoded (shared/messages.py).

A body over MAX_TASK_BYTES, a field of the wrong type or past its bound, or one of our headers
out of range raises InvalidMessage (reason 'invalid_message'), so nothing unbounded reaches Redis
keys, log lines or PostgreSQL: a 1 MB run id once stalled a worker's writes, and an attempt
header of 10**18 left its message parked. The error names the field and what was wrong, never
the value itself. A dead letter carries at most MAX_TASK_BYTES of body (`bounded_body`).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from shared.errors import InvalidMessage
from shared.urls import MAX_URL_CHARS

QUEUE_KINDS = ("priority", "ttl", "bulk")
# The renderers' queue (python -m renderer): a task routed there keeps "render" as its kind, so
# its retries and deferrals come back to the render queue, not to a worker's.
RENDER_KIND = "render"
TASK_KINDS = (*QUEUE_KINDS, RENDER_KIND)
BODY_BYTES_HEADER = "crawl-body-bytes"  # size of a dead letter's body before it was cut
BODY_SHA256_HEADER = "crawl-body-sha256"  # and its hash

# Bounds of what a message may carry. The largest task the producer writes (a 2,048-character
# URL, a source of as much, JSON escapes) stays well under MAX_TASK_BYTES.
MAX_TASK_BYTES = 32 * 1024
BODY_EXCERPT_BYTES = 4 * 1024  # what is kept of a longer body, for a person to look at
# A run id is part of Redis keys and of the pages' primary key.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A canonical URL is ASCII without spaces or control characters (shared/urls.py).
_NOT_IN_A_URL = re.compile(r"[^\x21-\x7e]")
MAX_SOURCE_CHARS = 4096
MAX_SHORT_TEXT_CHARS = 64  # lastmod, changefreq
MAX_MESSAGE_PRIORITY = 255  # what AMQP can carry
MAX_COUNT = 1000  # attempts and replays: far past any MAX_ATTEMPTS, far short of integer overflow
LATEST_EPOCH_S = 4_102_444_800.0  # 2100-01-01: a time past it is not a time we wrote
MAX_REASON_CHARS = 64
MAX_ERROR_CHARS = 2000
MAX_NAME_CHARS = 255  # queue names, worker ids

TaskFields = tuple[
    str, str, str, int, str | None, str | None, float | None, str, float, str | None, int | None
]
MAX_TASK_DEPTH = 1_000  # of a discovered URL: far past any useful depth


def task_fields(data: dict[str, Any]) -> TaskFields:
    """The fields of a task, in CrawlTask's order, each checked for type and bounds."""
    # Checked one by one with plain type() tests: this runs for every page a worker handles.
    return (*_addressing_fields(data), *_descriptive_fields(data), _depth(data))


def _depth(data: dict[str, Any]) -> int | None:
    depth = data.get("depth")
    if depth is not None and (type(depth) is not int or not 0 <= depth <= MAX_TASK_DEPTH):
        raise InvalidMessage(f"field 'depth': expected null or 0 to {MAX_TASK_DEPTH}, got {shape(depth)}")
    return depth


def _addressing_fields(data: dict[str, Any]) -> tuple[str, str, str, int]:
    """What the page is, which run it belongs to, and which queue and priority it travels with."""
    url, run_id, queue = data.get("url"), data.get("run_id"), data.get("queue")
    if type(url) is not str or not 0 < len(url) <= MAX_URL_CHARS or _NOT_IN_A_URL.search(url):
        raise InvalidMessage(f"field 'url': expected 1 to {MAX_URL_CHARS} characters, got {shape(url)}")
    if type(run_id) is not str or not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidMessage(
            f"field 'run_id': expected up to 64 letters, digits, '.', '-' or '_', got {shape(run_id)}"
        )
    if type(queue) is not str or queue not in TASK_KINDS:
        raise InvalidMessage(f"field 'queue': unknown queue {shape(queue)}")
    priority = data.get("priority", 0)
    if type(priority) is not int or not 0 <= priority <= MAX_MESSAGE_PRIORITY:
        raise InvalidMessage(f"field 'priority': expected 0 to {MAX_MESSAGE_PRIORITY}, got {shape(priority)}")
    return url, run_id, queue, priority


def _descriptive_fields(
    data: dict[str, Any],
) -> tuple[str | None, str | None, float | None, str, float, str | None]:
    """What the sitemap said of the page, where it was found, when it was queued, and the run it
    is a recrawl of."""
    lastmod, changefreq = data.get("lastmod"), data.get("changefreq")
    for name, text in (("lastmod", lastmod), ("changefreq", changefreq)):
        if text is not None and (
            type(text) is not str or len(text) > MAX_SHORT_TEXT_CHARS or not encodable(text)
        ):
            raise InvalidMessage(
                f"field {name!r}: expected null or up to {MAX_SHORT_TEXT_CHARS} characters, got {shape(text)}"
            )
    sitemap_priority = data.get("sitemap_priority")
    if sitemap_priority is not None and not (is_number(sitemap_priority) and 0 <= sitemap_priority <= 1):
        raise InvalidMessage(
            f"field 'sitemap_priority': expected null or 0 to 1, got {shape(sitemap_priority)}"
        )
    source = data.get("source", "")
    if type(source) is not str or len(source) > MAX_SOURCE_CHARS or not encodable(source):
        raise InvalidMessage(
            f"field 'source': expected up to {MAX_SOURCE_CHARS} characters, got {shape(source)}"
        )
    enqueued_at = data.get("enqueued_at")
    if enqueued_at is None:
        enqueued_at = time.time()
    elif not (is_number(enqueued_at) and 0 <= enqueued_at <= LATEST_EPOCH_S):
        raise InvalidMessage(f"field 'enqueued_at': expected epoch seconds, got {shape(enqueued_at)}")
    recrawl_of = data.get("recrawl_of")
    if recrawl_of is not None and (type(recrawl_of) is not str or not RUN_ID_PATTERN.fullmatch(recrawl_of)):
        raise InvalidMessage(f"field 'recrawl_of': expected null or a run id, got {shape(recrawl_of)}")
    return lastmod, changefreq, sitemap_priority, source, enqueued_at, recrawl_of


def header_count(headers: Mapping[str, Any], name: str, strict: bool) -> int:
    value = headers.get(name)
    if value is None:
        return 0
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    if strict:
        raise InvalidMessage(f"header {name!r}: expected a count from 0 to {MAX_COUNT}, got {shape(value)}")
    return 0


def header_epoch_s(headers: Mapping[str, Any], name: str, strict: bool) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    if is_number(value) and 0 <= value <= LATEST_EPOCH_S:
        return float(value)
    if strict:
        raise InvalidMessage(f"header {name!r}: expected epoch seconds, got {shape(value)}")
    return None


def bounded_body(body: bytes) -> tuple[bytes, dict[str, Any]]:
    """The body to dead-letter, and headers to send with it: the body itself when a task could
    be that long (so it can be replayed), else an excerpt, with the size and sha256 of the whole
    in headers. A 50 MB message must not become a 50 MB dead letter."""
    if len(body) <= MAX_TASK_BYTES:
        return body, {}
    return body[:BODY_EXCERPT_BYTES], {
        BODY_BYTES_HEADER: len(body),
        BODY_SHA256_HEADER: hashlib.sha256(body).hexdigest(),
    }


def is_number(value: Any) -> bool:
    kind = type(value)
    return kind is int or (kind is float and math.isfinite(value))


def encodable(text: str) -> bool:
    """Not a lone surrogate in it (JSON can spell one; UTF-8, and so PostgreSQL, cannot).
    Canonical URLs are ASCII, so the encoding is tried only on the rare other text."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def shape(value: Any) -> str:
    """What a bad value looked like, short whatever its size: the message must not carry it."""
    if isinstance(value, str | bytes | list | dict):
        text = repr(value)
        return f"{type(value).__name__} of length {len(value)}" if len(text) > 40 else text
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**12:
        return f"an int of {len(str(abs(value)))} digits"
    return repr(value)[:40]


def cut_text(value: Any, limit: int) -> str:
    if isinstance(value, bytes):
        # Cut before decoding: a header can be megabytes.
        return value[: limit * 4].decode("utf-8", "replace")[:limit]
    return value[:limit] if isinstance(value, str) else ""
