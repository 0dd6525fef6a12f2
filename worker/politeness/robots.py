"""robots.txt (RFC 9309): fetched once per domain per ROBOTS_TTL_S, shared by every worker.

    Robots.rules_for(url, fetch) -> RobotsRules     (allows(url), crawl_delay_s)

The verdict for a domain lives in Redis (keys.robots) with an expiry. The first worker to miss
it takes a short lock (keys.robots_lock) and fetches; the others wait for its verdict a little,
then defer their URL. The fetch goes through the caller's `fetch`: the worker's own guarded
HTTP client behind the domain's rate limit, never urllib.robotparser's own fetching.

What the answer means (RFC 9309 §2.3.1):
- 2xx: the rules, parsed by Protego (first 500 KiB);
- 4xx, too many redirects: no usable robots.txt, everything is allowed;
- 5xx, 429, network failure: "unreachable". The RFC says to assume complete disallow. We keep
  the URL instead of dropping it: it fails transiently (reason robots_unavailable), goes
  through the usual retries, and is dead-lettered with that reason after the last attempt, so
  nothing is fetched from such a site and nothing is lost. The failure is remembered briefly
  so that a down server is not asked again by every worker.
A failing proxy is not the site's fault: that URL is retried and nothing is remembered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import redis
import requests
from protego import Protego

from shared.errors import PermanentError, TransientError
from shared.http.proxies import ProxyFailed
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.try_later import TryLater
from shared.urls import domain_of
from worker.fetch.fetcher import Fetcher
from worker.fetch.verdicts import Verdict, classify
from worker.politeness.lines import Lines, Turn

log = logging.getLogger("worker.robots")  # the name operators know: kept as the module moved

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 asks parsers to read at least 500 KiB; the rest is ignored
UNAVAILABLE_TTL_S = 10.0  # how long an unreachable robots.txt is remembered
LOCAL_MEMO_S = 30.0  # parsed rules are reused in-process this long before Redis is asked again
LOCAL_MEMO_MAX = 4096  # domains remembered in-process
WAIT_POLL_S = 0.1  # how often a worker waiting for another's robots.txt fetch looks again
ROBOTS_PENDING_RETRY_S = 1.0

RULES, ALLOW_ALL, UNAVAILABLE = "rules", "allow_all", "unavailable"


@dataclass(frozen=True)
class RobotsAnswer:
    """What the server said when asked for /robots.txt (after redirects)."""

    status: int
    body: bytes


@dataclass(frozen=True)
class RobotsEntry:
    """The cached verdict for one domain."""

    verdict: str  # rules | allow_all | unavailable
    text: str = ""  # the robots.txt, for `rules`
    detail: str = ""  # why, for `unavailable` and `allow_all`

    def encode(self) -> bytes:
        return json.dumps(
            {"v": 1, "verdict": self.verdict, "text": self.text, "detail": self.detail}
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RobotsEntry | None:
        try:
            data = json.loads(raw)
            if data.get("v") != 1 or data["verdict"] not in (RULES, ALLOW_ALL, UNAVAILABLE):
                return None
            return cls(str(data["verdict"]), str(data["text"]), str(data["detail"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def interpret(answer: RobotsAnswer) -> RobotsEntry:
    """RFC 9309 §2.3.1: what an answer to /robots.txt means for the site's URLs."""
    if 200 <= answer.status < 300:
        text = answer.body.decode("utf-8", errors="replace").lstrip("\ufeff")
        return RobotsEntry(RULES, text)
    if 400 <= answer.status < 500:
        return RobotsEntry(ALLOW_ALL, detail=f"HTTP {answer.status}")
    if 300 <= answer.status < 400:  # a redirect without a usable Location
        return RobotsEntry(ALLOW_ALL, detail=f"HTTP {answer.status} without Location")
    return RobotsEntry(UNAVAILABLE, detail=f"HTTP {answer.status}")


def judge_robots(response: requests.Response, conditional: bool) -> Verdict:
    """Every status is an answer about robots.txt, read by `interpret`, except redirects, which
    are followed, and 429/503, which raise Throttled and so pause or slow the whole domain."""
    status = response.status_code
    if status in (429, 503):
        return classify(status, retry_after=response.headers.get("Retry-After"))
    if 300 <= status < 400 and (response.headers.get("Location") or "").strip():
        return Verdict.REDIRECT
    return Verdict.OK


def fetch_robots(fetcher: Fetcher, url: str, proxy: str | None = None) -> RobotsAnswer:
    """GET a robots.txt with the worker's own client: its timeouts, redirect checks and proxy."""
    result = fetcher.request(url, {}, proxy, judge_robots, ROBOTS_MAX_BYTES, truncate=True)
    return RobotsAnswer(result.status, result.body)


def product_token(user_agent: str) -> str:
    """'crawl-pipeline/0.1 (+https://…)' -> 'crawl-pipeline': what robots.txt groups name.
    Matching the whole header instead would let a group for 'github' match our contact URL."""
    token = user_agent.strip().split("/", 1)[0].split()
    return token[0].lower() if token else "*"


def robots_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/robots.txt", "", ""))


class RobotsRules:
    """Parsed rules for one user agent. Without a parser, everything is allowed."""

    def __init__(self, parser: Protego | None, agent: str) -> None:
        self._parser = parser
        self._agent = agent

    @classmethod
    def from_entry(cls, entry: RobotsEntry, agent: str) -> RobotsRules:
        return cls(Protego.parse(entry.text) if entry.verdict == RULES else None, agent)

    def allows(self, url: str) -> bool:
        return self._parser is None or bool(self._parser.can_fetch(url, self._agent))

    @property
    def crawl_delay_s(self) -> float | None:
        if self._parser is None:
            return None
        delay = self._parser.crawl_delay(self._agent)
        return float(delay) if delay else None


class RobotsStore(Protocol):
    def get(self, domain: str) -> bytes | None: ...

    def put(self, domain: str, value: bytes, ttl_s: float) -> None: ...

    def claim(self, domain: str, ttl_s: float) -> str | None:
        """A token if this caller now holds the domain's fetch lock, else None."""
        ...

    def unclaim(self, domain: str, token: str) -> None: ...


# Delete the lock only if it is still ours: it may have expired and been taken by another.
_UNCLAIM_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisRobotsStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._unclaim = client.register_script(_UNCLAIM_LUA)

    def get(self, domain: str) -> bytes | None:
        with translate_redis_errors(self._client):
            value = self._client.get(self._keys.robots(domain))
        return value if isinstance(value, bytes) else None

    def put(self, domain: str, value: bytes, ttl_s: float) -> None:
        with translate_redis_errors(self._client):
            self._client.set(self._keys.robots(domain), value, px=max(1, round(ttl_s * 1000)))

    def claim(self, domain: str, ttl_s: float) -> str | None:
        token = uuid.uuid4().hex
        with translate_redis_errors(self._client):
            taken = self._client.set(self._keys.robots_lock(domain), token, nx=True, px=round(ttl_s * 1000))
        return token if taken else None

    def unclaim(self, domain: str, token: str) -> None:
        with translate_redis_errors(self._client):
            self._unclaim(keys=[self._keys.robots_lock(domain)], args=[token])


class Robots:
    def __init__(
        self,
        store: RobotsStore,
        user_agent: str,
        ttl_s: float,
        claim_ttl_s: float,
        max_wait_s: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._agent = product_token(user_agent)
        self._ttl_s = ttl_s
        self._claim_ttl_s = claim_ttl_s
        self._max_wait_s = max_wait_s
        self._sleep = sleep
        self._clock = clock
        self._memo: dict[str, tuple[float, RobotsEntry, RobotsRules]] = {}
        self._memo_lock = threading.Lock()
        self._lines = Lines()  # a domain's rules are looked up by one thread at a time

    def rules_for(self, url: str, fetch: Callable[[str], RobotsAnswer]) -> RobotsRules:
        """The rules for `url`'s domain, fetching robots.txt if no worker has lately.

        Raises TransientError('robots_unavailable') when robots.txt is unreachable, and
        TryLater when another worker, or thread, is fetching it and does not finish in time."""
        domain = domain_of(url)
        memo = self._remembered(domain) or self._look_up(domain, url, fetch)
        entry, rules = memo
        if entry.verdict == UNAVAILABLE:
            raise TransientError("robots_unavailable", f"{robots_url(url)}: {entry.detail}")
        return rules

    def _look_up(
        self, domain: str, url: str, fetch: Callable[[str], RobotsAnswer]
    ) -> tuple[RobotsEntry, RobotsRules]:
        """Reads (or fetches) and remembers the domain's rules, one thread of the process at a
        time: the threads behind find them remembered. When every handler thread looked them up
        on its own, each of a worker's 24 threads read and parsed them at the start of a crawl,
        and some again every LOCAL_MEMO_S: 24-27 lookups a worker in a 200-page crawl of one
        host, about 1 ms of CPU each in that crowd, where one would do."""
        # At least as long as the URL would be held for otherwise: a thread behind a memo's
        # refresh waits the millisecond it takes, even where rate-limit waits are not slept.
        with self._lines.turn(domain, max(self._max_wait_s, ROBOTS_PENDING_RETRY_S)) as turn:
            if turn is Turn.MISSED:  # the thread ahead is still fetching, or waiting for another worker
                raise TryLater(ROBOTS_PENDING_RETRY_S, "robots_pending")
            memo = self._remembered(domain)  # by the thread ahead, or one that just left the line
            if memo is None:
                entry = self._cached(domain) or self._fetch_once(domain, robots_url(url), fetch)
                memo = self._remember(domain, entry)
            return memo

    def _fetch_once(self, domain: str, url: str, fetch: Callable[[str], RobotsAnswer]) -> RobotsEntry:
        token = self._store.claim(domain, self._claim_ttl_s)
        if token is None:
            return self._await(domain)
        try:
            entry = self._cached(domain)  # fetched by another worker between our look and claim
            if entry is None:
                entry = self._fetch(url, fetch)
                ttl_s = UNAVAILABLE_TTL_S if entry.verdict == UNAVAILABLE else self._ttl_s
                self._store.put(domain, entry.encode(), min(ttl_s, self._ttl_s))
            return entry
        finally:
            self._store.unclaim(domain, token)

    def _fetch(self, url: str, fetch: Callable[[str], RobotsAnswer]) -> RobotsEntry:
        try:
            answer = fetch(url)
        except ProxyFailed:
            raise  # our proxy's fault, not the site's: retry the URL, remember nothing
        except TransientError as exc:  # network, timeout, 429/503
            log.warning("robots.txt %s unreachable: %s", url, exc)
            return RobotsEntry(UNAVAILABLE, detail=exc.reason)
        except PermanentError as exc:  # too many redirects, bad encoding, refused address, ...
            log.warning("robots.txt %s unusable (%s): allowing everything", url, exc)
            return RobotsEntry(ALLOW_ALL, detail=exc.reason)
        entry = interpret(answer)
        log.info("robots.txt %s: HTTP %d, %s", url, answer.status, entry.verdict)
        return entry

    def _await(self, domain: str) -> RobotsEntry:
        deadline = self._clock() + self._max_wait_s
        while self._clock() < deadline:
            self._sleep(WAIT_POLL_S)
            entry = self._cached(domain)
            if entry is not None:
                return entry
        raise TryLater(ROBOTS_PENDING_RETRY_S, "robots_pending")

    def _cached(self, domain: str) -> RobotsEntry | None:
        raw = self._store.get(domain)
        return None if raw is None else RobotsEntry.decode(raw)

    def _remembered(self, domain: str) -> tuple[RobotsEntry, RobotsRules] | None:
        with self._memo_lock:
            found = self._memo.get(domain)
        if found is None or found[0] <= self._clock():
            return None
        return found[1], found[2]

    def _remember(self, domain: str, entry: RobotsEntry) -> tuple[RobotsEntry, RobotsRules]:
        rules = RobotsRules.from_entry(entry, self._agent)
        keep_s = min(LOCAL_MEMO_S, UNAVAILABLE_TTL_S if entry.verdict == UNAVAILABLE else self._ttl_s)
        with self._memo_lock:
            if len(self._memo) >= LOCAL_MEMO_MAX:
                self._memo.clear()  # crude, but bounded; a miss costs one Redis read
            self._memo[domain] = (self._clock() + keep_s, entry, rules)
        return entry, rules
