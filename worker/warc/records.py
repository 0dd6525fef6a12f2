"""WARC 1.1 records as bytes: the named fields, the block, the digests, one gzip member each.

Each record is compressed as a gzip member of its own, so that a reader given a file, an offset
and a length can seek there and read that record alone (what the page rows and a CDXJ index
point at). Digests are SHA-1 in base32, as the WARC world writes them. A response record's block
is the status line, the headers and the body as received (the body still in its
Content-Encoding, so a replay tool decodes it once, as a browser would); `Transfer-Encoding` is
left out of the stored headers, since http.client has already undone the chunked framing.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from urllib.parse import urlsplit

from worker.warc.exchange import ArchivedAs, Exchange, sha1_digest

WARC_VERSION = b"WARC/1.1"
REVISIT_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
REVISIT_IDENTICAL = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
HTTP_RESPONSE = "application/http; msgtype=response"
HTTP_REQUEST = "application/http; msgtype=request"
# zlib's fastest level: a record is written on the handler's path, under the GIL; level 6
# saved a few per cent of disk for about three times the CPU (bench/warc_cost.py).
GZIP_LEVEL = 1
_HOP_HEADERS = frozenset({"transfer-encoding"})

Fields = list[tuple[str, str]]


def gzip_member(data: bytes) -> bytes:
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def record_bytes(fields: Fields, block: bytes) -> bytes:
    """One uncompressed record: version line, fields, Content-Length, blank line, block, two CRLFs."""
    lines = [WARC_VERSION]
    for name, value in fields:
        lines.append(f"{name}: {_one_line(value)}".encode())
    lines.append(f"Content-Length: {len(block)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + block + b"\r\n\r\n"


def _one_line(value: str) -> str:
    # A header value from a server is one line already; a URL or a name of ours may not be.
    return value.replace("\r", " ").replace("\n", " ")


def header_lines(first_line: str, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [first_line] + [f"{name}: {value}" for name, value in headers]
    # Latin-1, as http.client decoded them: the bytes go back as they came.
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


def response_head(exchange: Exchange) -> bytes:
    kept = (pair for pair in exchange.headers if pair[0].lower() not in _HOP_HEADERS)
    return header_lines(f"{exchange.http_version} {exchange.status} {exchange.reason}", kept)


def request_block(exchange: Exchange) -> bytes:
    path = _request_target(exchange.url)
    return header_lines(f"GET {path} HTTP/1.1", exchange.request_headers)


def _request_target(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def warcinfo(record_id: str, date: str, filename: str, info: Fields) -> bytes:
    block = b"".join(f"{name}: {_one_line(value)}\r\n".encode() for name, value in info)
    fields = [
        ("WARC-Type", "warcinfo"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Filename", filename),
        ("Content-Type", "application/warc-fields"),
        ("WARC-Block-Digest", sha1_digest(block)),
    ]
    return record_bytes(fields, block)


def response(exchange: Exchange, record_id: str, date: str, warcinfo_id: str) -> bytes:
    block = response_head(exchange) + exchange.body
    fields = [
        ("WARC-Type", "response"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Target-URI", exchange.url),
        ("WARC-Warcinfo-ID", warcinfo_id),
        ("Content-Type", HTTP_RESPONSE),
        ("WARC-Payload-Digest", exchange.payload_digest),
        ("WARC-Block-Digest", sha1_digest(block)),
    ]
    if exchange.truncated:
        fields.append(("WARC-Truncated", "length"))
    return record_bytes(fields, block)


def request(exchange: Exchange, record_id: str, date: str, warcinfo_id: str, concurrent_to: str) -> bytes:
    block = request_block(exchange)
    fields = [
        ("WARC-Type", "request"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Target-URI", exchange.url),
        ("WARC-Warcinfo-ID", warcinfo_id),
        ("WARC-Concurrent-To", concurrent_to),
        ("Content-Type", HTTP_REQUEST),
        ("WARC-Block-Digest", sha1_digest(block)),
    ]
    return record_bytes(fields, block)


def revisit(
    target_uri: str,
    record_id: str,
    date: str,
    warcinfo_id: str,
    refers_to: ArchivedAs | None,
    payload_digest: str | None,
    not_modified: Exchange | None,
) -> bytes:
    """A 304's revisit (`not_modified`, its headers the block: profile server-not-modified), or
    one for a cached body used without asking the server (no block: identical-payload-digest)."""
    block = response_head(not_modified) if not_modified is not None else b""
    profile = REVISIT_NOT_MODIFIED if not_modified is not None else REVISIT_IDENTICAL
    fields = [
        ("WARC-Type", "revisit"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Target-URI", target_uri),
        ("WARC-Warcinfo-ID", warcinfo_id),
        ("WARC-Profile", profile),
    ]
    if refers_to is not None:
        fields += [
            ("WARC-Refers-To", refers_to.record_id),
            ("WARC-Refers-To-Target-URI", refers_to.target_uri),
            ("WARC-Refers-To-Date", refers_to.date),
        ]
    if payload_digest is not None:
        fields.append(("WARC-Payload-Digest", payload_digest))
    if block:
        fields.append(("Content-Type", HTTP_RESPONSE))
    fields.append(("WARC-Block-Digest", sha1_digest(block)))
    return record_bytes(fields, block)


def resource(
    target_uri: str, record_id: str, date: str, warcinfo_id: str, content_type: str, body: bytes
) -> bytes:
    """A page that no HTTP exchange of ours gave as it is (the renderer's DOM after scripts ran)."""
    digest = sha1_digest(body)
    fields = [
        ("WARC-Type", "resource"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Target-URI", target_uri),
        ("WARC-Warcinfo-ID", warcinfo_id),
        ("Content-Type", content_type or "application/octet-stream"),
        ("WARC-Payload-Digest", digest),
        ("WARC-Block-Digest", digest),
    ]
    return record_bytes(fields, body)
