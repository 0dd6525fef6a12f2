"""The one response type of the worker: the fetcher makes it, the cache keeps and returns it, the
handler parses it and stores a row from it. Where it came from is in the fields (`from_cache`,
`not_modified`, `fetch_ms`), so nothing converts it on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.warc.exchange import ArchivedAs, Exchange


@dataclass(frozen=True)
class Response:
    final_url: str  # after redirects
    status: int
    content_type: str | None  # raw header, charset included
    body: bytes  # decoded from any Content-Encoding; empty on a 304
    etag: str | None = None
    last_modified: str | None = None
    fetch_ms: int | None = None  # None when no request was made for it (a fresh cache entry)
    from_cache: bool = False  # the body came from the cache (fresh, or revalidated by a 304)
    not_modified: bool = False  # a 304 answered our conditional request
    proxy: str | None = None  # the proxy it came through, without credentials
    robots_tag: str | None = None  # the X-Robots-Tag header: a discovery run follows no links on "nofollow"
    # With WARC_DIR set: the exchange as it went over the wire (raw body), for its WARC records,
    # and for a body from the cache, the response record it was first archived as.
    exchange: Exchange | None = None
    archived: ArchivedAs | None = None


@dataclass(frozen=True)
class CacheEntry:
    response: Response  # as cached: from_cache set, no fetch_ms
    fresh: bool  # young enough to use without asking the server
