"""Builds a CrawlHandler from real parts: requests, Redis and PostgreSQL."""

from __future__ import annotations

import redis

from shared.keys import Keys
from shared.settings import Settings
from shared.topology import build_topology
from shared.urls import fingerprint
from worker.cache import ResponseCache
from worker.fetch import Fetcher, FetchResult
from worker.handler import CrawlHandler, Fetch, Response
from worker.ratelimit import RateLimiter
from worker.redis_errors import translate_redis_errors
from worker.store import ResultStore


def connect_redis(settings: Settings) -> redis.Redis:
    client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=10
    )
    with translate_redis_errors(settings.redis_url):
        client.ping()
    return client


def to_response(result: FetchResult) -> Response:
    return Response(
        final_url=result.final_url,
        status=result.status,
        content_type=result.content_type or "",
        body=result.body,
        fetch_ms=result.elapsed_ms,
        from_cache=False,
    )


class HttpFetch:
    """A Fetcher (one pooled HTTP session) for one handler thread; fresh responses go to the cache."""

    def __init__(self, settings: Settings, cache: ResponseCache) -> None:
        self._fetcher = Fetcher(settings)
        self._cache = cache

    def __call__(self, url: str) -> Response:
        result = self._fetcher.fetch(url)
        self._cache.put(fingerprint(url).hex(), result)
        return to_response(result)


class RedisCache:
    def __init__(self, cache: ResponseCache) -> None:
        self._cache = cache

    def get(self, url: str) -> Response | None:
        cached = self._cache.get(fingerprint(url).hex())
        if cached is None:
            return None
        return Response(
            cached.final_url, cached.status, cached.content_type or "", cached.body, None, from_cache=True
        )


class RedisRateLimit:
    def __init__(self, limiter: RateLimiter, settings: Settings) -> None:
        self._limiter = limiter
        self._settings = settings

    def wait_s(self, domain: str) -> tuple[float, bool]:
        reservation = self._limiter.reserve(
            domain, self._settings.rate_limit_rps, max_wait_s=self._settings.max_inline_wait_s
        )
        return reservation.wait_s, reservation.reserved


def build_handler(settings: Settings, client: redis.Redis) -> CrawlHandler:
    keys = Keys(settings.redis_prefix)
    cache = ResponseCache.from_settings(client, settings)

    def fetch_for_thread() -> Fetch:
        return HttpFetch(settings, cache)

    return CrawlHandler(
        settings=settings,
        topology=build_topology(settings),
        fetch_for_thread=fetch_for_thread,
        cache=RedisCache(cache),
        rate_limit=RedisRateLimit(RateLimiter(client, keys), settings),
        store=ResultStore(settings),
    )
