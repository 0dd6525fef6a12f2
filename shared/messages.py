"""Messages on the wire: frozen dataclasses with encode()/decode().

A task body never changes once published. What changes as a URL moves through retries and
dead-lettering travels in headers of our own (no ``x-`` prefix: since RabbitMQ 3.13 the broker
owns those); the producer's first publish carries none, which reads as a fresh URL. A body that
does not decode raises DecodeError, which dead-letters the message instead of crash-looping it.

Everything a message brings is bounded where it is decoded: a body over MAX_TASK_BYTES, a field
of the wrong type or past its limit, or one of our headers out of range raises InvalidMessage
(reason 'invalid_message'), so nothing unbounded reaches Redis keys, log lines or PostgreSQL.
A dead letter carries a body of at most MAX_TASK_BYTES (`bounded_body`): a longer one is cut to
an excerpt, and its size and sha256 travel in headers.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import DecodeError, InvalidMessage
from shared.urls import MAX_URL_CHARS

QUEUE_KINDS = ("priority", "ttl", "bulk")
# One encoder for every task body: json.dumps with any option builds a new encoder per call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
_json_string = json.encoder.encode_basestring_ascii  # the C function json.dumps uses for str

# Our own headers.
ATTEMPT_HEADER = "crawl-attempt"  # failed attempts so far; crashes and deferrals do not count
REPLAY_HEADER = "crawl-replays"  # times an operator replayed this URL from the dead-letter store
FIRST_FAILURE_HEADER = "crawl-first-failure-at"  # epoch seconds of the first failed attempt
REASON_HEADER = "crawl-reason"
ERROR_HEADER = "crawl-error"
STATUS_HEADER = "crawl-http-status"
ORIGIN_HEADER = "crawl-origin-queue"
WORKER_HEADER = "crawl-worker"
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


@dataclass(frozen=True)
class CrawlTask:
    """One URL to fetch, as the producer published it."""

    url: str
    run_id: str
    queue: str  # the work queue kind it belongs to: priority | ttl | bulk
    priority: int = 0  # message priority (meaningful on the priority queue)
    lastmod: str | None = None
    changefreq: str | None = None
    sitemap_priority: float | None = None
    source: str = ""  # the sitemap or file it came from
    enqueued_at: float = field(default_factory=time.time)
    recrawl_of: str | None = None  # the earlier run this recrawl compares its pages with

    def encode(self) -> bytes:
        """Compact JSON of the fields in declaration order, as json.dumps of asdict() gives it."""
        return TaskBodies(self.run_id, self.enqueued_at, self.recrawl_of).body(
            self.url,
            self.queue,
            self.priority,
            self.lastmod,
            self.changefreq,
            self.sitemap_priority,
            self.source,
        )

    @classmethod
    def decode(cls, body: bytes) -> CrawlTask:
        """The task `body` holds; DecodeError if it is not a JSON object, InvalidMessage if it
        is one whose fields are not a task's (each checked for type and bounds)."""
        if len(body) > MAX_TASK_BYTES:
            raise InvalidMessage(f"body of {len(body)} bytes, over the {MAX_TASK_BYTES} a task can take")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DecodeError(f"body is not JSON ({exc.__class__.__name__})") from None
        except RecursionError:
            raise DecodeError("body is not JSON (nested too deep)") from None
        if not isinstance(data, dict):
            raise DecodeError("body is not a JSON object")
        return cls._checked(data)

    @classmethod
    def _checked(cls, data: dict[str, Any]) -> CrawlTask:
        # Checked one by one with plain type() tests: this runs for every page a worker handles.
        url, run_id, queue = data.get("url"), data.get("run_id"), data.get("queue")
        if type(url) is not str or not 0 < len(url) <= MAX_URL_CHARS or _NOT_IN_A_URL.search(url):
            raise InvalidMessage(f"field 'url': expected 1 to {MAX_URL_CHARS} characters, got {_shape(url)}")
        if type(run_id) is not str or not RUN_ID_PATTERN.fullmatch(run_id):
            raise InvalidMessage(
                f"field 'run_id': expected up to 64 letters, digits, '.', '-' or '_', got {_shape(run_id)}"
            )
        if type(queue) is not str or queue not in QUEUE_KINDS:
            raise InvalidMessage(f"field 'queue': unknown queue {_shape(queue)}")
        priority = data.get("priority", 0)
        if type(priority) is not int or not 0 <= priority <= MAX_MESSAGE_PRIORITY:
            raise InvalidMessage(
                f"field 'priority': expected 0 to {MAX_MESSAGE_PRIORITY}, got {_shape(priority)}"
            )
        lastmod, changefreq = data.get("lastmod"), data.get("changefreq")
        for name, text in (("lastmod", lastmod), ("changefreq", changefreq)):
            if text is not None and (
                type(text) is not str or len(text) > MAX_SHORT_TEXT_CHARS or not _encodable(text)
            ):
                raise InvalidMessage(
                    f"field {name!r}: expected null or up to {MAX_SHORT_TEXT_CHARS} characters, "
                    f"got {_shape(text)}"
                )
        sitemap_priority = data.get("sitemap_priority")
        if sitemap_priority is not None and not (_is_number(sitemap_priority) and 0 <= sitemap_priority <= 1):
            raise InvalidMessage(
                f"field 'sitemap_priority': expected null or 0 to 1, got {_shape(sitemap_priority)}"
            )
        source = data.get("source", "")
        if type(source) is not str or len(source) > MAX_SOURCE_CHARS or not _encodable(source):
            raise InvalidMessage(
                f"field 'source': expected up to {MAX_SOURCE_CHARS} characters, got {_shape(source)}"
            )
        enqueued_at = data.get("enqueued_at")
        if enqueued_at is None:
            enqueued_at = time.time()
        elif not (_is_number(enqueued_at) and 0 <= enqueued_at <= LATEST_EPOCH_S):
            raise InvalidMessage(f"field 'enqueued_at': expected epoch seconds, got {_shape(enqueued_at)}")
        recrawl_of = data.get("recrawl_of")
        if recrawl_of is not None and (
            type(recrawl_of) is not str or not RUN_ID_PATTERN.fullmatch(recrawl_of)
        ):
            raise InvalidMessage(f"field 'recrawl_of': expected null or a run id, got {_shape(recrawl_of)}")
        return cls(
            url,
            run_id,
            queue,
            priority,
            lastmod,
            changefreq,
            sitemap_priority,
            source,
            enqueued_at,
            recrawl_of,
        )


class TaskBodies:
    """The bodies of tasks that share a run, an enqueue time and a recrawl: CrawlTask.encode()
    without a CrawlTask, for the producer, which encodes every URL it publishes.

    Spelt out field by field, and what a batch shares spelt once: json.dumps took a quarter
    of the producer's loop. A unit test holds the bytes to json.dumps's; numbers that JSON
    spells unlike Python (NaN, true) and values of other types take json's own way.
    """

    def __init__(self, run_id: str, enqueued_at: float, recrawl_of: str | None) -> None:
        self._run_id, self._enqueued_at, self._recrawl_of = run_id, enqueued_at, recrawl_of
        self._plain = _plain(enqueued_at)
        try:
            self._run_id_json = _text(run_id)
            self._tail = f',"enqueued_at":{_number(enqueued_at)},"recrawl_of":{_text(recrawl_of)}}}'
        except TypeError:  # a text field holding something else
            self._plain = False
        self._source: str | None = None  # the last source spelt, and its spelling: a sitemap
        self._source_json = "null"  # gives hundreds of URLs in a row

    def body(
        self,
        url: str,
        queue: str,
        priority: int,
        lastmod: str | None,
        changefreq: str | None,
        sitemap_priority: float | None,
        source: str,
    ) -> bytes:
        if self._plain and _plain(priority) and _plain(sitemap_priority):
            try:
                if source is not self._source:
                    self._source_json, self._source = _text(source), source
                return (
                    f'{{"url":{_text(url)},"run_id":{self._run_id_json},"queue":{_text(queue)},'
                    f'"priority":{_number(priority)},"lastmod":{_text(lastmod)},'
                    f'"changefreq":{_text(changefreq)},"sitemap_priority":{_number(sitemap_priority)},'
                    f'"source":{self._source_json}{self._tail}'
                ).encode()
            except TypeError:
                pass
        fields = {
            "url": url,
            "run_id": self._run_id,
            "queue": queue,
            "priority": priority,
            "lastmod": lastmod,
            "changefreq": changefreq,
            "sitemap_priority": sitemap_priority,
            "source": source,
            "enqueued_at": self._enqueued_at,
            "recrawl_of": self._recrawl_of,
        }
        return _COMPACT_JSON.encode(fields).encode()


@dataclass(frozen=True)
class Progress:
    """How far a URL has got: read from and written to our own headers."""

    attempt: int = 0
    replays: int = 0
    first_failure_at: float | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None, *, strict: bool = False) -> Progress:
        """Our headers, bounded. A count that is not an int in 0..MAX_COUNT, or a time that is
        not epoch seconds, raises InvalidMessage when `strict` (the worker, which then
        dead-letters the message), and reads as absent otherwise (the dead-letter consumer,
        which must record whatever arrives)."""
        if not headers:
            return _FRESH
        first = headers.get(FIRST_FAILURE_HEADER)
        if first is not None and not (_is_number(first) and 0 <= first <= LATEST_EPOCH_S):
            if strict:
                raise InvalidMessage(
                    f"header {FIRST_FAILURE_HEADER!r}: expected epoch seconds, got {_shape(first)}"
                )
            first = None
        return cls(
            attempt=_count(headers, ATTEMPT_HEADER, strict),
            replays=_count(headers, REPLAY_HEADER, strict),
            first_failure_at=None if first is None else float(first),
        )

    def to_headers(self) -> dict[str, Any]:
        headers: dict[str, Any] = {ATTEMPT_HEADER: self.attempt, REPLAY_HEADER: self.replays}
        if self.first_failure_at is not None:
            # AMQP tables have no portable float type; whole seconds are plenty here.
            headers[FIRST_FAILURE_HEADER] = int(self.first_failure_at)
        return headers

    def failed_once_more(self, now: float) -> Progress:
        return Progress(self.attempt + 1, self.replays, self.first_failure_at or now)


_FRESH = Progress()


@dataclass(frozen=True)
class Failure:
    """Why a URL was dead-lettered, carried in headers beside the unchanged task body."""

    reason: str
    error: str = ""
    http_status: int | None = None
    origin_queue: str = ""
    worker_id: str = ""

    def to_headers(self) -> dict[str, Any]:
        headers: dict[str, Any] = {
            REASON_HEADER: self.reason,
            ERROR_HEADER: self.error[:2000],
            ORIGIN_HEADER: self.origin_queue,
            WORKER_HEADER: self.worker_id,
        }
        if self.http_status is not None:
            headers[STATUS_HEADER] = self.http_status
        return headers

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None) -> Failure | None:
        """Read by the dead-letter consumer, which records what it gets: every field is cut
        to its bound rather than refused."""
        headers = headers or {}
        reason = _as_str(headers.get(REASON_HEADER), MAX_REASON_CHARS)
        if not reason:
            return None
        status = headers.get(STATUS_HEADER)
        return cls(
            reason=reason,
            error=_as_str(headers.get(ERROR_HEADER), MAX_ERROR_CHARS),
            http_status=status if type(status) is int and 100 <= status <= 999 else None,
            origin_queue=_as_str(headers.get(ORIGIN_HEADER), MAX_NAME_CHARS),
            worker_id=_as_str(headers.get(WORKER_HEADER), MAX_NAME_CHARS),
        )


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


def _text(value: str | None) -> str:
    return "null" if value is None else _json_string(value)


def _number(value: float | None) -> str:
    return "null" if value is None else repr(value)


def _plain(number: float | None) -> bool:
    """JSON spells it as Python's repr() does (not a bool, NaN or infinity)."""
    kind = type(number)
    return kind is int or number is None or (kind is float and math.isfinite(number))


def _is_number(value: Any) -> bool:
    kind = type(value)
    return kind is int or (kind is float and math.isfinite(value))


def _encodable(text: str) -> bool:
    """Not a lone surrogate in it (JSON can spell one; UTF-8, and so PostgreSQL, cannot).
    Canonical URLs are ASCII, so the encoding is tried only on the rare other text."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _count(headers: Mapping[str, Any], name: str, strict: bool) -> int:
    value = headers.get(name)
    if value is None:
        return 0
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    if strict:
        raise InvalidMessage(f"header {name!r}: expected a count from 0 to {MAX_COUNT}, got {_shape(value)}")
    return 0


def _shape(value: Any) -> str:
    """What a bad value looked like, short whatever its size: the message must not carry it."""
    if isinstance(value, str | bytes | list | dict):
        text = repr(value)
        return f"{type(value).__name__} of length {len(value)}" if len(text) > 40 else text
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**12:
        return f"an int of {len(str(abs(value)))} digits"
    return repr(value)[:40]


def _as_str(value: Any, limit: int) -> str:
    if isinstance(value, bytes):
        # Cut before decoding: a header can be megabytes.
        return value[: limit * 4].decode("utf-8", "replace")[:limit]
    return value[:limit] if isinstance(value, str) else ""
