"""The response cache against the real Redis on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterator

import pytest
import redis

from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import fingerprint
from worker.fetch.cache import ResponseCache
from worker.fetch.response import CacheEntry, Response

URL = "http://site.example/old"
FP = fingerprint(URL).hex()
STORED_AT = 1_700_000_000.5
BODY = "<html><head><title>Grüße</title></head><body>".encode() + b"x" * 2000 + b"</body></html>"

PAGE = Response(
    final_url="http://site.example/new",
    status=200,
    content_type="text/html; charset=utf-8",
    body=BODY,
    etag='"abc"',
    last_modified="Mon, 01 Jan 2024 00:00:00 GMT",
    fetch_ms=12,
    proxy="http://127.0.0.1:9",
)
CACHED = Response(
    final_url="http://site.example/new",
    status=200,
    content_type="text/html; charset=utf-8",
    body=BODY,
    etag='"abc"',
    last_modified="Mon, 01 Jan 2024 00:00:00 GMT",
    from_cache=True,
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
    fresh_s: float = 0.0,
    now: float = STORED_AT,
) -> ResponseCache:
    return ResponseCache(client, keys, ttl_s, max_body_bytes, enabled, fresh_s, clock=lambda: now)


def test_round_trip(client: redis.Redis, keys: Keys) -> None:
    """What was fetched comes back as cached: no fetch time, no proxy, from_cache set."""
    cache = make_cache(client, keys)
    assert cache.put(URL, PAGE) is True
    assert cache.get(URL) == CacheEntry(CACHED, fresh=False)


def test_an_entry_is_fresh_while_younger_than_fresh_s(client: redis.Redis, keys: Keys) -> None:
    make_cache(client, keys).put(URL, PAGE)
    assert make_cache(client, keys, fresh_s=60.0, now=STORED_AT + 59.0).get(URL) == CacheEntry(CACHED, True)
    assert make_cache(client, keys, fresh_s=60.0, now=STORED_AT + 60.0).get(URL) == CacheEntry(CACHED, False)


def test_an_entry_in_the_stored_format_reads_back(client: redis.Redis, keys: Keys) -> None:
    """Entries written before the worker had one response type are read as they were."""
    header = {"v": 1, "url": CACHED.final_url, "status": 200, "ct": CACHED.content_type}
    header |= {"etag": CACHED.etag, "lm": CACHED.last_modified, "at": STORED_AT}
    client.set(keys.cache(FP), json.dumps(header).encode() + b"\n" + zlib.compress(BODY))
    assert make_cache(client, keys).get(URL) == CacheEntry(CACHED, fresh=False)


def test_a_revalidated_response_is_stored_again(client: redis.Redis, keys: Keys) -> None:
    """After a 304 the handler hands back the cached body as a 200 with not_modified set."""
    revalidated = dataclasses.replace(CACHED, fetch_ms=5, not_modified=True)
    assert make_cache(client, keys).put(URL, revalidated) is True
    assert make_cache(client, keys).get(URL) == CacheEntry(CACHED, fresh=False)


def test_missing_entry_is_none(client: redis.Redis, keys: Keys) -> None:
    assert make_cache(client, keys).get("http://site.example/never") is None


def test_entry_expires_after_the_ttl_and_is_compressed(client: redis.Redis, keys: Keys) -> None:
    make_cache(client, keys, ttl_s=30.0).put(URL, PAGE)
    assert 29_000 < client.pttl(keys.cache(FP)) <= 30_000
    stored = client.get(keys.cache(FP))
    assert isinstance(stored, bytes)
    assert len(stored) < len(BODY) / 2  # 2,000 repeated bytes compress well


def test_oversize_body_is_not_cached(client: redis.Redis, keys: Keys) -> None:
    cache = make_cache(client, keys, max_body_bytes=len(BODY) - 1)
    assert cache.put(URL, PAGE) is False
    assert client.exists(keys.cache(FP)) == 0
    assert cache.get(URL) is None


def test_body_exactly_at_the_cap_is_cached(client: redis.Redis, keys: Keys) -> None:
    cache = make_cache(client, keys, max_body_bytes=len(BODY))
    assert cache.put(URL, PAGE) is True
    cached = cache.get(URL)
    assert cached is not None and cached.response.body == BODY


@pytest.mark.parametrize(
    "result",
    [
        dataclasses.replace(PAGE, status=203),
        dataclasses.replace(PAGE, status=304, not_modified=True, body=b""),
        dataclasses.replace(PAGE, content_type="application/pdf"),
    ],
    ids=["not-200", "not-modified", "not-html"],
)
def test_only_200_html_is_cached(client: redis.Redis, keys: Keys, result: Response) -> None:
    assert make_cache(client, keys).put(URL, result) is False
    assert client.exists(keys.cache(FP)) == 0


@pytest.mark.parametrize(
    ("etag", "last_modified", "fresh_s", "stored"),
    [
        (None, None, 0.0, False),
        ('"abc"', None, 0.0, True),
        (None, "Mon, 01 Jan 2024 00:00:00 GMT", 0.0, True),
        (None, None, 60.0, True),
    ],
    ids=["no-validators", "etag-only", "last-modified-only", "no-validators-but-used-fresh"],
)
def test_an_entry_is_kept_only_when_a_later_crawl_could_use_it(
    client: redis.Redis, keys: Keys, etag: str | None, last_modified: str | None, fresh_s: float, stored: bool
) -> None:
    page = dataclasses.replace(PAGE, etag=etag, last_modified=last_modified)
    assert make_cache(client, keys, fresh_s=fresh_s).put(URL, page) is stored
    assert client.exists(keys.cache(FP)) == int(stored)


def test_disabled_cache_neither_stores_nor_reads(client: redis.Redis, keys: Keys) -> None:
    make_cache(client, keys).put(URL, PAGE)  # an entry an enabled cache wrote earlier
    disabled = make_cache(client, keys, enabled=False)
    assert disabled.get(URL) is None
    other = "http://site.example/other"
    assert disabled.put(other, PAGE) is False
    assert client.exists(keys.cache(fingerprint(other).hex())) == 0


@pytest.mark.parametrize(
    "value",
    [b"no header line", b"not json\n", b'{"v":99}\n', b'{"v":1,"url":"u"}\nnot zlib'],
    ids=["no-newline", "bad-json", "other-version", "bad-body"],
)
def test_undecodable_entry_is_a_miss(client: redis.Redis, keys: Keys, value: bytes) -> None:
    client.set(keys.cache(FP), value)
    assert make_cache(client, keys).get(URL) is None


def test_from_settings_uses_the_cache_settings(client: redis.Redis, settings: Settings) -> None:
    tiny = dataclasses.replace(settings, cache_max_body_bytes=10, cache_ttl_s=5.0)
    cache = ResponseCache.from_settings(client, tiny)
    assert cache.put(URL, PAGE) is False  # over 10 bytes
    small = dataclasses.replace(PAGE, body=b"<p>hi</p>")
    assert cache.put(URL, small) is True
    assert 0 < client.pttl(Keys(settings.redis_prefix).cache(FP)) <= 5_000
