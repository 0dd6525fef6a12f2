"""Messages on the wire: frozen dataclasses with encode()/decode().

A task body never changes once published. What changes as a URL moves through retries and
dead-lettering travels in headers of our own (no ``x-`` prefix: since RabbitMQ 3.13 the broker
owns those); the producer's first publish carries none, which reads as a fresh URL. A body that
does not decode raises DecodeError, which dead-letters the message instead of crash-looping it.

Everything a message brings is bounded where it is decoded (shared/message_bounds.py): a field
or one of our headers out of bounds raises InvalidMessage (reason 'invalid_message').
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import DecodeError, InvalidMessage
from shared.message_bounds import (
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TASK_BYTES,
    cut_text,
    header_count,
    header_epoch_s,
    task_fields,
)
from shared.message_bounds import QUEUE_KINDS as QUEUE_KINDS  # re-exported, where it always was

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
    depth: int | None = None  # links followed from a start or sitemap URL (0); None: no discovery

    def encode(self) -> bytes:
        """Compact JSON of the fields in declaration order, as json.dumps of asdict() gives it."""
        return TaskBodies(self.run_id, self.enqueued_at, self.recrawl_of, self.depth).body(
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
        return cls(*task_fields(data))


class TaskBodies:
    """The bodies of tasks that share a run, an enqueue time and a recrawl: CrawlTask.encode()
    without a CrawlTask, for the producer, which encodes every URL it publishes.

    Spelt out field by field, and what a batch shares spelt once: json.dumps took a quarter
    of the producer's loop. A unit test holds the bytes to json.dumps's; numbers that JSON
    spells unlike Python (NaN, true) and values of other types take json's own way.
    """

    def __init__(
        self, run_id: str, enqueued_at: float, recrawl_of: str | None, depth: int | None = None
    ) -> None:
        self._run_id, self._enqueued_at, self._recrawl_of = run_id, enqueued_at, recrawl_of
        self._depth = depth
        self._plain = _plain(enqueued_at) and _plain(depth)
        try:
            self._run_id_json = _text(run_id)
            self._tail = (
                f',"enqueued_at":{_number(enqueued_at)},"recrawl_of":{_text(recrawl_of)}'
                f',"depth":{_number(depth)}}}'
            )
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
            "depth": self._depth,
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
        return cls(
            attempt=header_count(headers, ATTEMPT_HEADER, strict),
            replays=header_count(headers, REPLAY_HEADER, strict),
            first_failure_at=header_epoch_s(headers, FIRST_FAILURE_HEADER, strict),
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
        reason = cut_text(headers.get(REASON_HEADER), MAX_REASON_CHARS)
        if not reason:
            return None
        status = headers.get(STATUS_HEADER)
        return cls(
            reason=reason,
            error=cut_text(headers.get(ERROR_HEADER), MAX_ERROR_CHARS),
            http_status=status if type(status) is int and 100 <= status <= 999 else None,
            origin_queue=cut_text(headers.get(ORIGIN_HEADER), MAX_NAME_CHARS),
            worker_id=cut_text(headers.get(WORKER_HEADER), MAX_NAME_CHARS),
        )


def _text(value: str | None) -> str:
    return "null" if value is None else _json_string(value)


def _number(value: float | None) -> str:
    return "null" if value is None else repr(value)


def _plain(number: float | None) -> bool:
    """JSON spells it as Python's repr() does (not a bool, NaN or infinity)."""
    kind = type(number)
    return kind is int or number is None or (kind is float and math.isfinite(number))
