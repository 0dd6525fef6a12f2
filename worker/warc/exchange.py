"""What a WARC record is made of: an HTTP exchange as it went over the wire, and the identity of
an earlier record that a revisit refers to. Plain values, so that the fetcher, the cache and the
handler can carry them without importing the writer."""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import uuid
from dataclasses import dataclass, field


def sha1_digest(data: bytes) -> str:
    """The conventional WARC digest form: `sha1:` and the base32 of the SHA-1."""
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode("ascii")


def new_record_id() -> str:
    return f"<urn:uuid:{uuid.uuid4()}>"


def warc_date(timestamp: float) -> str:
    """WARC 1.1's date: UTC, to the microsecond."""
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Exchange:
    """One request and its answer, as sent and received: the body's raw bytes, still in their
    Content-Encoding (the transfer framing, chunked or not, is undone by http.client)."""

    url: str
    request_headers: tuple[tuple[str, str], ...]  # as sent, Host first
    http_version: str  # "HTTP/1.1"
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]  # as received, in order and case
    body: bytes = b""  # raw; empty for a 304
    started_at: float = 0.0  # time.time() when the request went out
    truncated: bool = False  # cut at the body cap (robots.txt only, today)
    # Chosen as it is fetched, so that the cache can keep it for a later revisit to name.
    record_id: str = field(default_factory=new_record_id)

    @functools.cached_property
    def payload_digest(self) -> str:
        return sha1_digest(self.body)


@dataclass(frozen=True)
class ArchivedAs:
    """The response record an earlier fetch of a URL left, as a revisit names it."""

    record_id: str  # "<urn:uuid:...>"
    target_uri: str
    date: str  # its WARC-Date
    payload_digest: str


@dataclass(frozen=True)
class WarcLocation:
    """Where a page's record is: the file's closed name, the gzip member's offset and length."""

    filename: str
    offset: int
    length: int
    record_id: str = field(default="", compare=False)


def archived_as(exchange: Exchange) -> ArchivedAs:
    """The response record `exchange` is written as, as a later revisit names it."""
    return ArchivedAs(
        exchange.record_id, exchange.url, warc_date(exchange.started_at), exchange.payload_digest
    )
