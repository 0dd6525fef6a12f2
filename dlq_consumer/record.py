"""What one dead-lettered message says about its URL: a pure function from a received message to
the row the store keeps. No I/O here, so every rule below is tested without a broker or database.

Where each field comes from, most trusted first:
  url, run_id      the task body; 'undecodable:<sha256 of body>' and '' when it does not decode
  reason, error    our Failure headers (the worker knew why) → 'undecodable' or 'invalid_message'
                   when the body is bad
                   → the broker's newest x-death entry ('expired', 'rejected', 'delivery_limit')
  origin queue     our Failure headers → the queue named in x-death → the body's queue kind,
                   always as the full queue name
  attempts/replays our Progress headers (a value out of bounds reads as 0)
  body             whole up to MAX_TASK_BYTES, else an excerpt; body_bytes and body_sha256 are of
                   the whole, from the worker's headers when it already cut the body

Every text field is cut to a bound, so no message, however built, makes a row PostgreSQL refuses
for its size; `bounded_record` is the last resort when it refuses one anyway.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from shared.amqp.topology import work_queue
from shared.errors import DecodeError
from shared.message_bounds import (
    BODY_BYTES_HEADER,
    BODY_SHA256_HEADER,
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    bounded_body,
)
from shared.messages import QUEUE_KINDS, CrawlTask, Failure, Progress

UNDECODABLE = "undecodable"
UNKNOWN_REASON = "unknown"
UNSTORABLE = "unstorable"
X_DEATH_HEADER = "x-death"
MAX_X_DEATH_ENTRIES = 20  # the broker keeps one per queue and reason: a handful
_HEX = frozenset("0123456789abcdef")


class ReceivedMessage(Protocol):
    """The parts of a delivery this module reads (shared.consumer.deliveries.Delivery has them)."""

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class DeadLetterRecord:
    """One dead letter, as made from a message (record_from_delivery) and as read back from the
    dead_letters table (dlq_consumer/store.py), which also fills the fields after body_sha256."""

    run_id: str
    url: str
    reason: str
    last_error: str
    http_status: int | None
    attempts: int
    replays: int
    origin_queue: str
    worker_id: str
    body: bytes
    x_death: list[Any] | None  # JSON-safe copy of the broker's header
    first_failed_at: dt.datetime | None  # from our headers when the worker set it; else stored as now
    # Of the whole body, which `body` may be an excerpt of; None in rows stored before the
    # dead_letters table had these columns.
    body_bytes: int | None = 0
    body_sha256: str | None = ""
    id: int = 0  # 0 until stored
    last_failed_at: dt.datetime | None = None
    state: str = "dead"  # dead | replayed
    replayed_at: dt.datetime | None = None

    def summary(self) -> dict[str, Any]:
        """The row as JSON-safe data, without the body (which replay uses, and people rarely)."""
        return {
            "id": self.id,
            "run_id": self.run_id,
            "url": self.url,
            "reason": self.reason,
            "last_error": self.last_error,
            "http_status": self.http_status,
            "attempts": self.attempts,
            "replays": self.replays,
            "origin_queue": self.origin_queue,
            "worker_id": self.worker_id,
            "body_bytes": len(self.body),  # as stored: an excerpt's, for a message cut short
            "x_death": self.x_death,
            "first_failed_at": _iso(self.first_failed_at),
            "last_failed_at": _iso(self.last_failed_at),
            "state": self.state,
            "replayed_at": _iso(self.replayed_at),
        }


def record_from_delivery(message: ReceivedMessage, namespace: str) -> DeadLetterRecord:
    """The row to store for `message`, found dead in the dead-letter queue of `namespace`."""
    headers = message.headers or {}
    progress = Progress.from_headers(headers)
    failure = Failure.from_headers(headers)
    deaths = _deaths(headers.get(X_DEATH_HEADER))
    newest_death = deaths[0] if deaths else {}  # the broker keeps the newest entry first

    body, body_bytes, body_sha256 = _body_of(message.body, headers)
    task: CrawlTask | None
    decode_reason = decode_error = ""
    try:
        task = CrawlTask.decode(message.body)
    except DecodeError as exc:
        task, decode_reason, decode_error = None, exc.reason, exc.detail

    if failure is not None:
        reason, error = failure.reason, failure.error
    elif task is None:
        reason, error = decode_reason, decode_error
    elif newest_death:
        reason = _as_text(newest_death.get("reason")) or UNKNOWN_REASON
        error = _describe_death(newest_death)
    else:
        reason, error = UNKNOWN_REASON, "dead-lettered without a reason header or x-death"

    origin = (failure.origin_queue if failure else "") or _as_text(newest_death.get("queue"))
    if not origin and task is not None:
        origin = task.queue
    if origin in QUEUE_KINDS:  # the worker names the kind; store the queue, as x-death does
        origin = work_queue(namespace, origin)

    if task is not None:
        run_id, url = task.run_id, task.url
    else:
        run_id, url = "", f"{UNDECODABLE}:{body_sha256}"

    return DeadLetterRecord(
        run_id=_clean(run_id),
        url=_clean(url),
        reason=_clean(reason[:MAX_REASON_CHARS]),
        last_error=_clean(error[:MAX_ERROR_CHARS]),
        http_status=failure.http_status if failure else None,
        attempts=progress.attempt,
        replays=progress.replays,
        origin_queue=_clean(origin[:MAX_NAME_CHARS]),
        worker_id=_clean(failure.worker_id if failure else ""),
        body=body,
        x_death=[json_safe(d) for d in deaths[:MAX_X_DEATH_ENTRIES]] if deaths else None,
        first_failed_at=_as_time(progress.first_failure_at),
        body_bytes=body_bytes,
        body_sha256=body_sha256,
    )


def bounded_record(record: DeadLetterRecord, refusal: str) -> DeadLetterRecord:
    """What is kept of a dead letter PostgreSQL refused to store (`refusal` is its message):
    keyed on the body's hash instead of the run and URL, with the fields that came from outside
    dropped and the refusal in `last_error`. Made of hex, short ASCII and our own numbers, it
    stores; the message is not parked for ever."""
    return DeadLetterRecord(
        run_id="",
        url=f"{UNSTORABLE}:{record.body_sha256}",
        reason=_ascii(record.reason, MAX_REASON_CHARS),
        last_error=_ascii(f"stored in bounded form; PostgreSQL refused the row: {refusal}", MAX_ERROR_CHARS),
        http_status=record.http_status,
        attempts=record.attempts,
        replays=record.replays,
        origin_queue=_ascii(record.origin_queue, MAX_NAME_CHARS),
        worker_id="",
        body=record.body,
        x_death=None,
        first_failed_at=None,
        body_bytes=record.body_bytes,
        body_sha256=record.body_sha256,
    )


def _body_of(received: bytes, headers: Mapping[str, Any]) -> tuple[bytes, int, str]:
    """The body to keep, and the size and sha256 of the whole: the worker's headers say them
    when it already cut the body to an excerpt."""
    body, _ = bounded_body(received)
    size, digest = headers.get(BODY_BYTES_HEADER), headers.get(BODY_SHA256_HEADER)
    if isinstance(digest, bytes):
        digest = digest.decode("ascii", "replace")
    if (
        body is received
        and type(size) is int
        and size > len(received)
        and isinstance(digest, str)
        and len(digest) == 64
        and set(digest) <= _HEX
    ):
        return body, size, digest
    return body, len(received), hashlib.sha256(received).hexdigest()


def _deaths(value: Any) -> list[Mapping[str, Any]]:
    """The x-death entries, ignoring anything that is not the list of tables the broker writes."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return []
    return [entry for entry in value if isinstance(entry, Mapping)]


def _describe_death(death: Mapping[str, Any]) -> str:
    text = f"{_as_text(death.get('reason')) or 'dead-lettered'} in {_as_text(death.get('queue')) or '?'}"
    count = death.get("count")
    return f"{text} ({count} times)" if isinstance(count, int) and count > 1 else text


def json_safe(value: Any) -> Any:
    """A copy of a decoded AMQP header value that json.dumps and PostgreSQL's jsonb accept."""
    if isinstance(value, Mapping):
        return {
            _clean(str(k)[:MAX_NAME_CHARS]): json_safe(v)
            for k, v in list(value.items())[:MAX_X_DEATH_ENTRIES]
        }
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value[:MAX_X_DEATH_ENTRIES]]
    return _json_safe_scalar(value)


def _json_safe_scalar(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return _bytes_as_text(value[:MAX_ERROR_CHARS])
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, str):
        return _clean(value[:MAX_ERROR_CHARS])
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # jsonb has no NaN or infinity
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        return str(value)  # past what JSON readers keep exact
    if value is None or isinstance(value, bool | int | float):
        return value
    return _clean(str(value)[:MAX_ERROR_CHARS])


def _as_time(epoch_s: float | None) -> dt.datetime | None:
    # Progress bounds it (shared/message_bounds.py), so it is always a datetime.
    return None if epoch_s is None else dt.datetime.fromtimestamp(epoch_s, dt.UTC)


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _bytes_as_text(value: bytes) -> str:
    """UTF-8 as the text it is; anything else in base64, marked as such."""
    try:
        return _clean(value.decode("utf-8"))
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode("ascii")


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def _ascii(text: str, limit: int) -> str:
    return text[:limit].encode("ascii", "replace").decode().replace("\x00", "?")


def _clean(text: str) -> str:
    # PostgreSQL text and jsonb cannot hold NUL; one in a header must not cost us the dead letter.
    return text.replace("\x00", "\ufffd")
