"""WARC 1.1 records as bytes: the named fields, the block, the digests, one gzip member each.

Each record is compressed as a gzip member of its own, so that a reader given a file, an offset
and a length can seek there and read that record alone (what the page rows and a CDXJ index
point at). Digests are SHA-1 in base32, as the WARC world writes them. A response record's block
is the status line, the headers and the body as received (the body still in its
Content-Encoding, so a replay tool decodes it once, as a browser would); `Transfer-Encoding` is
left out of the stored headers, since http.client has already undone the chunked framing.

A record is built as its pieces (the WARC head, then the block's parts, then the two CRLFs that
end it) and each piece goes to the digest and the compressor as it is: a page's body is never
copied into a record, only read, once for each digest and once for the compressor.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from isal import isal_zlib

from worker.warc.exchange import ArchivedAs, Exchange, sha1_digest

WARC_VERSION = b"WARC/1.1"
REVISIT_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
REVISIT_IDENTICAL = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
HTTP_RESPONSE = "application/http; msgtype=response"
HTTP_REQUEST = "application/http; msgtype=request"
# ISA-L's deflate (isal), level 1: a record is compressed on the handler's path, and on the real
# pages of bench/warc_cost.py it took a quarter of the CPU of zlib's fastest level for files a
# few per cent smaller; zlib's level 6 saved a fifth of the disk for ten times the CPU. Its
# members are plain gzip, read by zlib, warcio and every WARC tool.
GZIP_LEVEL = 1
_GZIP_WBITS = 16 + 15
_END = b"\r\n\r\n"
_HOP_HEADERS = frozenset({"transfer-encoding"})

Fields = list[tuple[str, str]]
Pieces = list[bytes]  # one record's bytes, in order, not joined


def gzip_member(pieces: Iterable[bytes]) -> bytes:
    compressor = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, _GZIP_WBITS)
    out = [compressor.compress(piece) for piece in pieces]
    out.append(compressor.flush())
    return b"".join(out)


def block_digest(block: Sequence[bytes]) -> str:
    """The digest of a block given in parts, as if joined."""
    sha1 = hashlib.sha1()
    for part in block:
        sha1.update(part)
    return "sha1:" + base64.b32encode(sha1.digest()).decode("ascii")


def record_pieces(fields: Fields, block: Sequence[bytes]) -> Pieces:
    """One uncompressed record: version line, fields, Content-Length, blank line, block, two CRLFs."""
    length = sum(len(part) for part in block)
    head = "".join(f"{name}: {_one_line(value)}\r\n" for name, value in fields)
    return [b"%s\r\n%sContent-Length: %d\r\n\r\n" % (WARC_VERSION, head.encode(), length), *block, _END]


def _one_line(value: str) -> str:
    # A header value from a server is one line already; a URL or a name of ours may not be.
    return value.replace("\r", " ").replace("\n", " ") if "\r" in value or "\n" in value else value


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


def warcinfo(record_id: str, date: str, filename: str, info: Fields) -> Pieces:
    block = b"".join(f"{name}: {_one_line(value)}\r\n".encode() for name, value in info)
    fields = [
        ("WARC-Type", "warcinfo"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Filename", filename),
        ("Content-Type", "application/warc-fields"),
        ("WARC-Block-Digest", sha1_digest(block)),
    ]
    return record_pieces(fields, [block])


def response(exchange: Exchange, record_id: str, date: str, warcinfo_id: str) -> Pieces:
    block = [response_head(exchange), exchange.body]
    fields = [
        ("WARC-Type", "response"),
        ("WARC-Record-ID", record_id),
        ("WARC-Date", date),
        ("WARC-Target-URI", exchange.url),
        ("WARC-Warcinfo-ID", warcinfo_id),
        ("Content-Type", HTTP_RESPONSE),
        ("WARC-Payload-Digest", exchange.payload_digest),  # computed once: the cache names it too
        ("WARC-Block-Digest", block_digest(block)),
    ]
    if exchange.truncated:
        fields.append(("WARC-Truncated", "length"))
    return record_pieces(fields, block)


def request(exchange: Exchange, record_id: str, date: str, warcinfo_id: str, concurrent_to: str) -> Pieces:
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
    return record_pieces(fields, [block])


def revisit(
    target_uri: str,
    record_id: str,
    date: str,
    warcinfo_id: str,
    refers_to: ArchivedAs | None,
    payload_digest: str | None,
    not_modified: Exchange | None,
) -> Pieces:
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
    return record_pieces(fields, [block])


def resource(
    target_uri: str, record_id: str, date: str, warcinfo_id: str, content_type: str, body: bytes
) -> Pieces:
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
        ("WARC-Block-Digest", digest),  # the block is the body: one digest serves both
    ]
    return record_pieces(fields, [body])
