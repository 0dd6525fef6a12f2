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
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from shared.keys import Keys
from shared.redis_errors import translate_redis_errors
from shared.settings import Settings
from worker.deferred_writes import write_later
from worker.fetch import FetchResult, Validators, is_html
from worker.parse import decode_html

log = logging.getLogger(__name__)

_FORMAT_VERSION = 1
# zlib's fastest level: on real pages (93 KB) it takes a third of level 6's CPU (0.5 against
# 1.45 ms a page) for entries a quarter larger (17 against 14 KB).
_ZLIB_LEVEL = 1


@dataclass(frozen=True)
class CachedResponse:
    final_url: str
    status: int
    content_type: str | None  # raw header, charset included
    etag: str | None
    last_modified: str | None
    body: bytes
    stored_at: float  # Unix time of the put, by the storing worker's clock

    def text(self) -> str:
        return decode_html(self.body, self.content_type)

    def is_fresh(self, fresh_s: float, now: float) -> bool:
        """Young enough (by `now`, Unix time) to use without asking the server."""
        return now - self.stored_at < fresh_s

    def validators(self) -> Validators | None:
        """What to send in a conditional request; None if the server gave us nothing to send."""
        if not self.etag and not self.last_modified:
            return None
        return Validators(self.etag, self.last_modified)


class ResponseCache:
    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        ttl_s: float,
        max_body_bytes: int,
        enabled: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0 and enabled:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._client = redis_client
        self._keys = keys
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._max_body_bytes = max_body_bytes
        self.enabled = enabled
        self._clock = clock

    @classmethod
    def from_settings(cls, redis_client: redis.Redis, settings: Settings) -> ResponseCache:
        return cls(
            redis_client,
            Keys(settings.redis_prefix),
            ttl_s=settings.cache_ttl_s,
            max_body_bytes=settings.cache_max_body_bytes,
            enabled=settings.cache_enabled,
        )

    def get(self, fingerprint_hex: str) -> CachedResponse | None:
        if not self.enabled:
            return None
        key = self._keys.cache(fingerprint_hex)
        with translate_redis_errors(self._client):
            raw = self._client.get(key)
        if raw is None:
            return None
        cached = self._decode(raw)
        if cached is None:
            log.warning("cache entry %s does not decode; treating it as a miss", key)
        return cached

    def put(self, fingerprint_hex: str, result: FetchResult) -> bool:
        """Store a 200 HTML response no larger than max_body_bytes; say whether it was stored."""
        if not self.enabled or not self._cacheable(result):
            return False
        header = {
            "v": _FORMAT_VERSION,
            "url": result.final_url,
            "status": result.status,
            "ct": result.content_type,
            "etag": result.etag,
            "lm": result.last_modified,
            "at": self._clock(),
        }
        body = zlib.compress(result.body, _ZLIB_LEVEL)
        value = json.dumps(header, separators=(",", ":")).encode() + b"\n" + body
        key = self._keys.cache(fingerprint_hex)
        with translate_redis_errors(self._client):
            # Nothing waits for this write: with a DeferringRedis it rides along with the
            # thread's next command.
            write_later(self._client, "SET", key, value, "PX", self._ttl_ms)
        return True

    def _cacheable(self, result: FetchResult) -> bool:
        return (
            result.status == 200
            and not result.not_modified
            and is_html(result.content_type)
            and len(result.body) <= self._max_body_bytes
        )

    def _decode(self, raw: Any) -> CachedResponse | None:
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
            return CachedResponse(
                final_url=str(header["url"]),
                status=int(header["status"]),
                content_type=_optional_str(header.get("ct")),
                etag=_optional_str(header.get("etag")),
                last_modified=_optional_str(header.get("lm")),
                body=body,
                stored_at=float(header["at"]),
            )
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
