"""The body as it came, for its WARC record: with WARC_DIR set, the fetcher reads a page's body
raw (urllib3's `decode_content=False`) and decodes it here (worker/warc/content_coding.py), one
read giving both; and the exchange as it went, request headers and answer, for the records."""

from __future__ import annotations

import io
from collections.abc import Callable
from urllib.parse import urlsplit

import requests

from shared.errors import PermanentError
from worker.parse.budget import ParseBudget, ParseLimitExceeded
from worker.parse.markup_scan import MarkupScan
from worker.warc.content_coding import BodyDecoder
from worker.warc.exchange import Exchange

_READ_CHUNK_BYTES = 64 * 1024  # as the fetcher reads a decoded body


def read_raw_body(
    response: requests.Response,
    max_bytes: int,
    check_deadline: Callable[[], object],
    url: str,
    budget: ParseBudget | None,
) -> tuple[bytes, bytes]:
    """(decoded, raw): the fetcher's body, with its caps (worker/fetch/fetcher.py), and the bytes
    as they came beside it, for the WARC record."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise PermanentError("too_large", f"Content-Length {declared} > {max_bytes}")
    decoder = BodyDecoder(response.headers.get("Content-Encoding"), url)
    body = io.BytesIO()
    raw = io.BytesIO() if decoder.decodes else body  # an identity body is held once, not twice
    size = 0
    scan = MarkupScan(budget) if budget is not None else None
    while True:
        check_deadline()  # raises past the fetch's deadline
        came = response.raw.read1(_READ_CHUNK_BYTES, decode_content=False)
        if not came:
            value = body.getvalue()
            return value, value if raw is body else raw.getvalue()
        chunk = decoder.decode(came, max_bytes - size) if decoder.decodes else came
        if raw is not body:
            raw.write(came)
        size += len(chunk)
        if size > max_bytes or raw.tell() > max_bytes:
            raise PermanentError("too_large", f"body over {max_bytes} bytes")
        if scan is not None:
            try:
                scan.feed(chunk)
            except ParseLimitExceeded as exc:
                raise PermanentError("parse_limit", f"{url}: {exc} in its first {size} bytes") from None
        body.write(chunk)


def exchange_of(url: str, response: requests.Response, raw_body: bytes, started_at: float) -> Exchange:
    """The exchange as it went: the request's headers as sent, Host first (http.client adds it
    from the URL), and the answer's status line and headers as received."""
    host = urlsplit(url).netloc.rpartition("@")[2]
    sent = response.request.headers if response.request is not None else {}
    version = {10: "HTTP/1.0", 11: "HTTP/1.1"}.get(response.raw.version, "HTTP/1.1")
    return Exchange(
        url=url,
        request_headers=(("Host", host), *((str(k), str(v)) for k, v in sent.items())),
        http_version=version,
        status=response.status_code,
        reason=response.raw.reason or response.reason or "",
        headers=tuple((str(k), str(v)) for k, v in response.raw.headers.items()),
        body=raw_body,
        started_at=started_at,
    )
