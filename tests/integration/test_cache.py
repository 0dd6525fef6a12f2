"""The response cache against the real Redis on 127.0.0.1."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import redis

from shared.keys import Keys
from shared.redis_client import OPERATOR, connect_redis
from shared.settings import Settings
from worker.cache import CachedResponse, ResponseCache
from worker.fetch import FetchResult

pytestmark = pytest.mark.integration

FP = "0123456789abcdef0123456789abcdef"
BODY = "<html><head><title>Grüße</title></head><body>".encode() + b"x" * 2000 + b"</body></html>"

PAGE = FetchResult(
    url="http://site.example/old",
    final_url="http://site.example/new",
    status=200,
    content_type="text/html; charset=utf-8",
    etag='"abc"',
    last_modified="Mon, 01 Jan 2024 00:00:00 GMT",
    retry_after=None,
    body=BODY,
    elapsed_ms=12,
    redirects=1,
    not_modified=False,
)


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, OPERATOR)
    yield made
    made.close()


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.redis_prefix)


def make_cache(
    client: redis.Redis,
    keys: Keys,
    *,
    ttl_s: float = 60.0,
    max_body_bytes: int = 10_000,
    enabled: bool = True,
) -> ResponseCache:
    return ResponseCache(client, keys, ttl_s, max_body_bytes, enabled, clock=lambda: 1_700_000_000.5)


def test_round_trip(client: redis.Redis, keys: Keys) -> None:
    cache = make_cache(client, keys)
    assert cache.put(FP, PAGE) is True
    assert cache.get(FP) == CachedResponse(
        final_url="http://site.example/new",
        status=200,
        content_type="text/html; charset=utf-8",
        etag='"abc"',
        last_modified="Mon, 01 Jan 2024 00:00:00 GMT",
        body=BODY,
        stored_at=1_700_000_000.5,
    )
    cached = cache.get(FP)
    assert cached is not None and "Grüße" in cached.text()


def test_missing_entry_is_none(client: redis.Redis, keys: Keys) -> None:
    assert make_cache(client, keys).get("f" * 32) is None


def test_entry_expires_after_the_ttl_and_is_compressed(client: redis.Redis, keys: Keys) -> None:
    make_cache(client, keys, ttl_s=30.0).put(FP, PAGE)
    assert 29_000 < client.pttl(keys.cache(FP)) <= 30_000
    stored = client.get(keys.cache(FP))
    assert isinstance(stored, bytes)
    assert len(stored) < len(BODY) / 2  # 2,000 repeated bytes compress well


def test_oversize_body_is_not_cached(client: redis.Redis, keys: Keys) -> None:
    cache = make_cache(client, keys, max_body_bytes=len(BODY) - 1)
    assert cache.put(FP, PAGE) is False
    assert client.exists(keys.cache(FP)) == 0
    assert cache.get(FP) is None


def test_body_exactly_at_the_cap_is_cached(client: redis.Redis, keys: Keys) -> None:
    cache = make_cache(client, keys, max_body_bytes=len(BODY))
    assert cache.put(FP, PAGE) is True
    cached = cache.get(FP)
    assert cached is not None and cached.body == BODY


@pytest.mark.parametrize(
    "result",
    [
        dataclasses.replace(PAGE, status=203),
        dataclasses.replace(PAGE, status=304, not_modified=True, body=b""),
        dataclasses.replace(PAGE, content_type="application/pdf"),
    ],
    ids=["not-200", "not-modified", "not-html"],
)
def test_only_200_html_is_cached(client: redis.Redis, keys: Keys, result: FetchResult) -> None:
    assert make_cache(client, keys).put(FP, result) is False
    assert client.exists(keys.cache(FP)) == 0


def test_disabled_cache_neither_stores_nor_reads(client: redis.Redis, keys: Keys) -> None:
    make_cache(client, keys).put(FP, PAGE)  # an entry an enabled cache wrote earlier
    disabled = make_cache(client, keys, enabled=False)
    assert disabled.get(FP) is None
    other = "e" * 32
    assert disabled.put(other, PAGE) is False
    assert client.exists(keys.cache(other)) == 0


@pytest.mark.parametrize(
    "value",
    [b"no header line", b"not json\n", b'{"v":99}\n', b'{"v":1,"url":"u"}\nnot zlib'],
    ids=["no-newline", "bad-json", "other-version", "bad-body"],
)
def test_undecodable_entry_is_a_miss(client: redis.Redis, keys: Keys, value: bytes) -> None:
    client.set(keys.cache(FP), value)
    assert make_cache(client, keys).get(FP) is None


def test_from_settings_uses_the_cache_settings(client: redis.Redis, settings: Settings) -> None:
    tiny = dataclasses.replace(settings, cache_max_body_bytes=10, cache_ttl_s=5.0)
    cache = ResponseCache.from_settings(client, tiny)
    assert cache.put(FP, PAGE) is False  # over 10 bytes
    small = dataclasses.replace(PAGE, body=b"<p>hi</p>")
    assert cache.put(FP, small) is True
    assert 0 < client.pttl(Keys(settings.redis_prefix).cache(FP)) <= 5_000
