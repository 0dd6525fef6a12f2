"""Outgoing proxies: which one a request uses, and benching the ones that keep failing.

PROXIES is a comma-separated list of proxy URLs (``http://user:password@host:port``). Each
request takes one, in turn (``round_robin``, per worker process) or at random. A proxy that
fails PROXY_MAX_FAILURES times within PROXY_BENCH_S is benched for PROXY_BENCH_S, for every
worker: the failure counter and the bench are Redis keys that expire by themselves. When every
proxy is benched, URLs wait (TryLater) rather than go out directly.

Credentials never leave the Proxy object: logs, Redis keys and stored rows use its `label`
(``scheme://host:port``).
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster

from shared.errors import ConfigError, TransientError
from shared.metrics import PROXY_FAILURES, PROXY_USABLE
from shared.redis.cluster import by_slot
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.try_later import TryLater

log = logging.getLogger("worker.proxies")  # the name operators know: kept as the module moved

_CREDENTIALS = re.compile(r"(^|//)[^/@\s]*@")  # userinfo after '//', or at the start
# socks5h:// resolves the site's name at the proxy, socks5:// here (requests' socks extra).
PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")


class ProxyFailed(TransientError):
    """The proxy, not the site, failed: it could not be reached or refused our credentials."""


def socks_proxy_at_fault(error: BaseException) -> bool:
    """Whether a connection error through a SOCKS proxy was the proxy's: it could not be reached,
    refused our login or answered nonsense. urllib3 reports them all as a failed connection, the
    PySocks error it came from only in the exception's context. A refusal the proxy relays from
    the site (SOCKS5Error: connection refused, host unreachable) stays the site's."""
    import socks

    seen: BaseException | None = error
    for _ in range(8):  # a chain of causes is short; a cycle must not loop
        if seen is None:
            return False
        if isinstance(seen, socks.SOCKS5Error):
            return False
        if isinstance(seen, socks.ProxyError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def without_credentials(text: str) -> str:
    """`text` with any user:password@ in URLs masked, for error details and log lines."""
    return _CREDENTIALS.sub(r"\1***@", text)


@dataclass(frozen=True)
class Proxy:
    url: str = field(repr=False)  # with credentials: for the HTTP client only
    label: str  # scheme://host:port: safe to log, to use in keys and to store

    @classmethod
    def parse(cls, raw: str, where: str = "PROXIES") -> Proxy:
        try:
            parts = urlsplit(raw)
            port = parts.port
        except ValueError:
            raise ConfigError(f"{where}: cannot parse {without_credentials(raw)!r}") from None
        if parts.scheme not in PROXY_SCHEMES or not parts.hostname or port is None:
            raise ConfigError(
                f"{where}: expected http(s)://, socks5:// or socks5h://[user:password@]host:port, "
                f"got {without_credentials(raw)!r}"
            )
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return cls(url=raw, label=f"{parts.scheme}://{host}:{port}")


def parse_proxies(text: str) -> list[Proxy]:
    return _distinct([Proxy.parse(part.strip()) for part in text.split(",") if part.strip()])


def proxies_of(settings: Settings) -> list[Proxy]:
    """PROXIES, then the lines of PROXY_FILE (one proxy a line; blank lines and # comments
    are passed over), each listed once."""
    proxies = [Proxy.parse(part.strip()) for part in settings.proxies.split(",") if part.strip()]
    if settings.proxy_file:
        try:
            with open(settings.proxy_file, encoding="utf-8") as file:
                lines = file.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            detail = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(f"PROXY_FILE: cannot read {settings.proxy_file!r} ({detail})") from None
        for number, line in enumerate(lines, 1):
            if line.strip() and not line.lstrip().startswith("#"):
                proxies.append(Proxy.parse(line.strip(), f"PROXY_FILE {settings.proxy_file}:{number}"))
    return _distinct(proxies)


def _distinct(proxies: list[Proxy]) -> list[Proxy]:
    labels = [p.label for p in proxies]
    if len(set(labels)) != len(labels):
        twice = next(label for label in labels if labels.count(label) > 1)
        raise ConfigError(f"PROXIES: {twice} is listed twice (PROXIES and PROXY_FILE together)")
    return proxies


class Bench(Protocol):
    """Shared proxy health; RedisBench is the real one."""

    def benched_s(self, labels: Sequence[str]) -> list[float]:
        """Seconds each proxy stays benched (0 = usable)."""
        ...

    def failed(self, label: str) -> bool:
        """Count one failure; True if that benched the proxy."""
        ...


# KEYS 1 failure counter  2 bench   ARGV 1 failures that bench  2 bench (and window) ms
_FAILED_LUA = """
local failures = redis.call('INCR', KEYS[1])
if failures == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if failures >= tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS the bench keys. Returns each one's remaining milliseconds (negative = not benched).
_BENCHED_LUA = """
local remaining = {}
for i, key in ipairs(KEYS) do
  remaining[i] = redis.call('PTTL', key)
end
return remaining
"""


class RedisBench:
    def __init__(self, client: redis.Redis, keys: Keys, max_failures: int, bench_s: float) -> None:
        self._client = client
        self._keys = keys
        self._max_failures = max_failures
        self._bench_ms = max(1, round(bench_s * 1000))
        self._failed = client.register_script(_FAILED_LUA)
        self._benched = client.register_script(_BENCHED_LUA)

    def benched_s(self, labels: Sequence[str]) -> list[float]:
        keys = [self._keys.proxy_bench(label) for label in labels]
        with translate_redis_errors(self._client):
            if not isinstance(self._client, RedisCluster):
                remaining = self._benched(keys=keys)
            else:  # each proxy's keys have a slot of their own: one call per slot
                remaining = [0] * len(keys)
                for group_keys, positions in by_slot(keys, range(len(keys))).values():
                    for i, ms in zip(positions, self._benched(keys=group_keys), strict=True):
                        remaining[i] = ms
        return [max(0, int(ms)) / 1000 for ms in remaining]

    def failed(self, label: str) -> bool:
        keys = [self._keys.proxy_failures(label), self._keys.proxy_bench(label)]
        with translate_redis_errors(self._client):
            return bool(self._failed(keys=keys, args=[self._max_failures, self._bench_ms]))


class ProxyPool:
    def __init__(
        self,
        proxies: Sequence[Proxy],
        rotation: str,
        bench: Bench,
        rng: random.Random | None = None,
    ) -> None:
        if not proxies:
            raise ValueError("a proxy pool needs at least one proxy")
        self._proxies = list(proxies)
        self._rotation = rotation
        self._bench = bench
        self._rng = rng or random.Random()
        self._turn = itertools.count()  # next() on a count is atomic under the GIL

    @classmethod
    def from_settings(cls, settings: Settings, client: redis.Redis) -> ProxyPool | None:
        proxies = proxies_of(settings)
        if not proxies:
            return None
        bench = RedisBench(
            client, Keys(settings.redis_prefix), settings.proxy_max_failures, settings.proxy_bench_s
        )
        return cls(proxies, settings.proxy_rotation, bench)

    @property
    def size(self) -> int:
        return len(self._proxies)

    def choose(self, avoid: Sequence[Proxy] = ()) -> Proxy:
        """The proxy for the next request, other than `avoid`; TryLater if none is usable."""
        benched = self._bench.benched_s([p.label for p in self._proxies])
        for proxy, left in zip(self._proxies, benched, strict=True):
            PROXY_USABLE.labels(proxy.label).set(0 if left > 0 else 1)
        usable = [p for p, left in zip(self._proxies, benched, strict=True) if left <= 0 and p not in avoid]
        if not usable:
            raise TryLater(max(min(benched), 1.0), "proxies_benched")
        if self._rotation == "random":
            return self._rng.choice(usable)
        # Round robin over the usable proxies only, so that a benched proxy's turns are shared
        # evenly among the others (taking the next one in the whole list would hand them all
        # to its neighbour). A proxy back from the bench is usable again, and takes turns at once.
        return usable[next(self._turn) % len(usable)]

    def failed(self, proxy: Proxy, error: TransientError) -> None:
        PROXY_FAILURES.labels(proxy.label).inc()
        if self._bench.failed(proxy.label):
            PROXY_USABLE.labels(proxy.label).set(0)
            log.warning("proxy %s benched after repeated failures: %s", proxy.label, error.reason)
        else:
            log.info("proxy %s failed: %s", proxy.label, error.reason)
