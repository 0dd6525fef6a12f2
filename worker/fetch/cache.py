"""A response cache in Redis, shared by every worker, so re-crawls (and URLs that reach us
twice) skip the network while fresh, and the body transfer once revalidated.

One string key per URL fingerprint (keys.cache(fingerprint_hex)), written with an expiry.
The value is a compact JSON header line, b"\\n", then the zlib-compressed body:

    {"v":1,"url":"https://…","status":200,"ct":"text/html","etag":null,"lm":null,"at":1.7e9}\\n<zlib>

json.dumps escapes newlines inside strings, so the first b"\\n" always ends the header.
A value that does not decode (an older format, a truncated write) is a miss, never an error:
the cache only saves work.

Freshness: an entry is kept for CACHE_TTL_S, but used without asking the server only while
younger than CACHE_FRESH_S (default 0: never). An older entry is revalidated: its ETag and
Last-Modified go out as If-None-Match / If-Modified-Since, and a 304 reuses the cached body,
after which the entry is stored again, fresh, for another CACHE_TTL_S.

An entry that could never be used is not written: a response with neither ETag nor
Last-Modified cannot be revalidated, so with CACHE_FRESH_S=0 nothing would ever read it but a
miss. Many dynamic sites send neither; for them the write was a compression and a Redis SET a
page (and the entry's memory for CACHE_TTL_S) bought for nothing.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

import redis

from shared.redis.deferred_writes import drop_read_ahead, read_ahead, write_later
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import fingerprint
from worker.fetch.response import CacheEntry, Response
from worker.fetch.verdicts import is_html
from worker.warc.exchange import ArchivedAs, archived_as

log = logging.getLogger("worker.cache")  # the name operators know: kept as the module moved

_FORMAT_VERSION = 1
# zlib's fastest level: on real pages (93 KB) it takes a third of level 6's CPU (0.5 against
# 1.45 ms a page) for entries a quarter larger (17 against 14 KB).
_ZLIB_LEVEL = 1


class ResponseCache:
    """The handler's Cache (worker/handling/ports.py): entries by URL, with their freshness."""

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        ttl_s: float,
        max_body_bytes: int,
        enabled: bool,
        fresh_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0 and enabled:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._client = redis_client
        self._keys = keys
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._max_body_bytes = max_body_bytes
        self.enabled = enabled
        self._fresh_s = fresh_s
        self._clock = clock

    @classmethod
    def from_settings(cls, redis_client: redis.Redis, settings: Settings) -> ResponseCache:
        return cls(
            redis_client,
            Keys(settings.redis_prefix),
            ttl_s=settings.cache_ttl_s,
            max_body_bytes=settings.cache_max_body_bytes,
            enabled=settings.cache_enabled,
            fresh_s=settings.cache_fresh_s,
        )

    def get(self, url: str) -> CacheEntry | None:
        if not self.enabled:
            return None
        key = self._keys.cache(fingerprint(url).hex())
        with translate_redis_errors(self._client):
            raw = self._client.get(key)
        if raw is None:
            return None
        entry = self._decode(raw)
        if entry is None:
            log.warning("cache entry %s does not decode; treating it as a miss", key)
        return entry

    def read_ahead(self, url: str) -> None:
        """Have `url`'s entry read with this thread's next Redis command, for get(url) to find
        (shared/redis/deferred_writes.py); without the cache, nothing."""
        if self.enabled:
            read_ahead(self._client, "GET", self._keys.cache(fingerprint(url).hex()))

    def drop_read_ahead(self) -> None:
        drop_read_ahead(self._client)

    def put(self, url: str, response: Response) -> bool:
        """Store a 200 HTML response no larger than max_body_bytes that a later crawl could use
        (see the module docstring); say whether it was stored. A response revalidated by a 304
        carries its whole cached body and is stored again, fresh."""
        if not self.enabled or not self._cacheable(response):
            return False
        header = {
            "v": _FORMAT_VERSION,
            "url": response.final_url,
            "status": response.status,
            "ct": response.content_type,
            "etag": response.etag,
            "lm": response.last_modified,
            "xrt": response.robots_tag,
            "at": self._clock(),
        }
        archived = _archived(response)
        if archived is not None:  # the record a later revisit of it names (worker/warc/)
            header["warc"] = [archived.record_id, archived.target_uri, archived.date, archived.payload_digest]
        body = zlib.compress(response.body, _ZLIB_LEVEL)
        value = json.dumps(header, separators=(",", ":")).encode() + b"\n" + body
        key = self._keys.cache(fingerprint(url).hex())
        with translate_redis_errors(self._client):
            # Nothing waits for this write: with a DeferringRedis it rides along with the
            # thread's next command.
            write_later(self._client, "SET", key, value, "PX", self._ttl_ms)
        return True

    def _cacheable(self, response: Response) -> bool:
        # A 304 as fetched has status 304 and no body; once the handler has put it together with
        # the cached body, it is a 200 again (not_modified=True) and is worth keeping.
        return (
            response.status == 200
            and is_html(response.content_type)
            and len(response.body) <= self._max_body_bytes
            and (self._fresh_s > 0 or response.etag is not None or response.last_modified is not None)
        )

    def _decode(self, raw: Any) -> CacheEntry | None:
        if not isinstance(raw, bytes):  # a client built with decode_responses=True
            return None
        header_line, newline, compressed = raw.partition(b"\n")
        if not newline:
            return None
        try:
            header = json.loads(header_line)
            if header.get("v") != _FORMAT_VERSION:
                return None
            body = self._decompress(compressed)
            if body is None:
                return None
            response = Response(
                final_url=str(header["url"]),
                status=int(header["status"]),
                content_type=_optional_str(header.get("ct")),
                body=body,
                etag=_optional_str(header.get("etag")),
                last_modified=_optional_str(header.get("lm")),
                robots_tag=_optional_str(header.get("xrt")),
                from_cache=True,
                archived=_archived_from(header.get("warc")),
            )
            # Young enough (by this worker's clock against the storing one's) to use as it is.
            return CacheEntry(response, fresh=self._clock() - float(header["at"]) < self._fresh_s)
        except (ValueError, KeyError, TypeError, AttributeError, zlib.error):
            return None

    def _decompress(self, compressed: bytes) -> bytes | None:
        # Bounded, so a corrupt or foreign value cannot inflate without limit.
        inflater = zlib.decompressobj()
        body = inflater.decompress(compressed, self._max_body_bytes + 1)
        if len(body) > self._max_body_bytes or not inflater.eof:
            return None
        return body


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _archived(response: Response) -> ArchivedAs | None:
    """The response record this response's body is in: its own when just fetched, or the one
    its cached body came from when a 304 revalidated it."""
    if response.exchange is not None and not response.not_modified:
        return archived_as(response.exchange)
    return response.archived


def _archived_from(value: object) -> ArchivedAs | None:
    if isinstance(value, list) and len(value) == 4 and all(isinstance(part, str) for part in value):
        return ArchivedAs(*value)
    return None
