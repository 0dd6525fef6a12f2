"""Builds a CrawlHandler from real parts: requests, Redis and PostgreSQL."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from shared import metrics
from shared.amqp.topology import build_topology
from shared.consumer import ConsumerHooks
from shared.errors import TaskError
from shared.http.netguard import check_url, guarded_session
from shared.http.proxies import Proxy, ProxyFailed, ProxyPool
from shared.redis.client import WORKER, connect_redis
from shared.redis.deferred_writes import DeferringRedis, DeferringRedisCluster, flush
from shared.redis.keys import Keys
from shared.redis.runstate import RunStates
from shared.settings import Settings
from worker.fetch.cache import ResponseCache
from worker.fetch.fetcher import Fetcher, Validators
from worker.fetch.response import CacheEntry, Response
from worker.handler import CrawlHandler
from worker.handling.handled import HandledMarks
from worker.handling.poison import DeliveryLimit
from worker.handling.render_figures import RenderFigures
from worker.parse.profiles import load_profiles
from worker.politeness.config import PolitenessConfig
from worker.politeness.gate import LEASE_MARGIN_S, DomainGate
from worker.politeness.ratelimit import RateLimiter
from worker.politeness.robots import RedisRobotsStore, Robots, RobotsAnswer, fetch_robots
from worker.store.writer import BATCH_ROWS, ResultStore
from worker.warc.archive import Archive

R = TypeVar("R")

HOST_POOLS = 64  # hosts a worker keeps connections to, the most recently used
M_ARENA_MAX = -8  # glibc's mallopt() parameter number
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> None:
    """glibc gives threads that allocate malloc arenas of their own, up to eight per core, and
    memory freed in an arena stays with it: with 32 handler threads a worker held several MB
    that no thread was using (86 MB peak against 80 with two arenas, 32 fetches in flight).
    Python code allocates only while it holds the GIL, so more arenas buy little concurrency.
    Must run before the handler threads start; elsewhere than glibc there is nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas)


def connect_worker_redis(settings: Settings) -> redis.Redis:
    """The worker's one client, shared by its handler threads: a DeferringRedis, so writes
    nothing waits for ride along with a thread's next command (shared/redis/deferred_writes.py)."""
    return connect_redis(
        settings, WORKER, client_class=DeferringRedis, cluster_class=DeferringRedisCluster, ping=True
    )


class HttpFetch:
    """The handler's Fetch: pages and robots.txt through the proxy pool, if any."""

    def __init__(self, fetcher: Fetcher, proxies: ProxyPool | None) -> None:
        self._fetcher = fetcher
        self._proxies = proxies

    def page(self, url: str, revalidate: CacheEntry | None) -> Response:
        validators = None
        if revalidate is not None:
            cached = revalidate.response
            if cached.etag or cached.last_modified:
                validators = Validators(cached.etag, cached.last_modified)
        started = time.monotonic()
        try:
            response = self._through(lambda proxy: self._fetch_page(url, validators, proxy))
        except TaskError as exc:
            metrics.observe_fetch(time.monotonic() - started, exc.http_status)
            raise
        metrics.observe_fetch(time.monotonic() - started, response.status)
        return response

    def _fetch_page(self, url: str, validators: Validators | None, proxy: Proxy | None) -> Response:
        if proxy is None:
            return self._fetcher.fetch(url, validators)
        # The label, not the URL: the row must not carry the proxy's credentials.
        return dataclasses.replace(self._fetcher.fetch(url, validators, proxy.url), proxy=proxy.label)

    def robots_txt(self, url: str) -> RobotsAnswer:
        return self._through(lambda proxy: fetch_robots(self._fetcher, url, proxy.url if proxy else None))

    def _through(self, call: Callable[[Proxy | None], R]) -> R:
        """`call` through a proxy from the pool (or directly, without one). When the proxy
        fails, one other proxy gets a try: a ProxyFailed request never reached the site, so
        this second try is still the one request the domain gate let through."""
        if self._proxies is None:
            return call(None)
        tried: list[Proxy] = []
        while True:
            proxy = self._proxies.choose(avoid=tried)
            try:
                return call(proxy)
            except ProxyFailed as exc:
                self._proxies.failed(proxy, exc)
                tried.append(proxy)
                if len(tried) >= min(2, self._proxies.size):
                    raise


def build_handler(settings: Settings, client: redis.Redis) -> CrawlHandler:
    # Python's thread switch interval stays at its 5 ms default. A 1 ms interval got a thread
    # whose rate-limit slot had come onto the GIL sooner, but it forced a switch, with its
    # futex calls and cold caches, every millisecond of every parse: measured side by side on
    # the latency-bound benchmark, a page cost 17% more CPU. A slot woken a few ms late only
    # sends late; the spacing check before each request (docs/POLITENESS.md) keeps the rate.
    limit_malloc_arenas()
    keys = Keys(settings.redis_prefix)
    cache = ResponseCache.from_settings(client, settings)
    proxies = ProxyPool.from_settings(settings, client)
    limiter = RateLimiter(client, keys, settings.rate_recovery_s, settings.rate_jitter)
    gate = DomainGate(limiter, PolitenessConfig.from_settings(settings), settings)
    robots = Robots(
        RedisRobotsStore(client, keys),
        settings.user_agent,
        ttl_s=settings.robots_ttl_s,
        # Held through the rate-limit wait and the whole fetch, then given back.
        claim_ttl_s=settings.max_inline_wait_s + settings.fetch_deadline_s + LEASE_MARGIN_S,
        max_wait_s=settings.max_inline_wait_s,
    )

    # One session, and so one fetcher, for every handler thread: urllib3's pools are
    # thread-safe, the requests are prepared without the session's merging (worker/fetch/fetcher.py)
    # and its cookie jar refuses every cookie, so the threads share no state but the pools. Shared pools
    # keep a connection to each of the last HOST_POOLS hosts. A session per thread kept its own
    # ten, so with more hosts than that in turn, most fetches opened a new connection, and the
    # idle ones cost a worker several MB. Every connection goes to an address the SSRF guard
    # has checked, on every redirect hop.
    session = guarded_session(
        settings,
        pool_hosts=HOST_POOLS,
        pool_size=min(settings.max_concurrent_per_domain, settings.fetch_concurrency),
    )
    archive = Archive.from_settings(settings)  # None without WARC_DIR
    return CrawlHandler(
        settings=settings,
        topology=build_topology(settings),
        fetch=HttpFetch(Fetcher(settings, lambda: session, check_url(settings)), proxies),
        cache=cache,
        gate=gate,
        robots=robots,
        # Messages whose rows wait for a commit stay unacked, and a worker is given only twice
        # its fetches in flight (the prefetch): commit once as many rows wait as there are
        # handler threads, rather than wait out the batch window while they crowd out new work.
        store=ResultStore(
            settings,
            batch_rows=min(BATCH_ROWS, settings.fetch_concurrency),
            before_commit=archive.sync if archive is not None else None,  # rows after their records
        ),
        profiles=load_profiles(settings.extraction_profiles_file),
        delivery_limit=DeliveryLimit(client, keys, settings.crawl_namespace, settings.worker_id),
        handled=HandledMarks(client, keys),
        # Its GET, once a second per run, carries the thread's held writes like any other.
        run_states=RunStates(client, keys),
        sent_to_render=RenderFigures(client, keys).sent,  # RENDER=auto's figure of the run
        archive=archive,
    )


def consumer_hooks(handler: CrawlHandler, client: redis.Redis) -> ConsumerHooks:
    """What the consumer loop asks of a crawl handler (a worker's or a renderer's) between its
    messages."""
    return ConsumerHooks(
        park=handler.parked,
        # The Redis writes a page leaves for the thread's next command go out when no message
        # is waiting for it (shared/redis/deferred_writes.py).
        when_idle=lambda: flush(client),
        # With nothing else in hand, the rows are committed at once: no more are coming to
        # share the transaction (the end of a crawl, a trickle of URLs).
        when_quiet=handler.store.commit_soon if isinstance(handler.store, ResultStore) else None,
    )


def close_handler(handler: CrawlHandler) -> None:
    """Once the consumer loop has returned: the last rows, then the WARC file they point into
    (it loses its .open, docs/WARC.md), then the handled marks."""
    if isinstance(handler.store, ResultStore):
        handler.store.close()
    if handler.archive is not None:
        handler.archive.close()
    if handler.handled is not None:
        handler.handled.close()
