"""One producer run, wired up: settings and options in, the JSON-ready summary out."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.dedup import Claim, Dedup
from producer.discovery_args import DiscoveryArgs
from producer.discovery_scope import DiscoveryOptions
from producer.discovery_store import store_options
from producer.fetch import Fetch, HttpFetcher
from producer.frontier_redis import keep_options
from producer.liveness import Heartbeat
from producer.pipeline import Pipeline
from producer.pipeline_types import Counts
from producer.progress import showing_progress
from producer.publisher import ConfirmingPublisher
from producer.recrawl import PreviousRun
from producer.routing import load_router
from producer.sitemaps import SitemapEntry, SitemapReader
from producer.sources import all_entries, check_url_files
from producer.spread import spread_hosts
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.crawl_request import new_run_id as new_run_id  # where producer callers found it
from shared.errors import ConfigError
from shared.http.netguard import check_url
from shared.http.proxies import ProxyPool
from shared.message_bounds import RUN_ID_PATTERN
from shared.redis.client import PRODUCER, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.signals import stop_signals_call
from shared.urls import InvalidURL, canonicalize

log = logging.getLogger(__name__)

START_WORKERS = (
    "python -m worker  (as many as you like, plus python -m dlq_consumer; "
    "or all in one: make crawl SITEMAP=<url>)"
)


@dataclass(frozen=True)
class Options:
    run_id: str = field(default_factory=new_run_id)
    sitemaps: Sequence[str] = ()
    sites: Sequence[str] = ()
    url_files: Sequence[str] = ()
    urls: Sequence[str] = ()  # page URLs as they are: a crawl request's (producer/serve.py)
    routing_file: str = ""  # overrides Settings.routing_file
    recrawl_of: str = ""  # an earlier run: publish only what changed since (producer/recrawl.py)
    once: bool = False  # a run seeded to the end before is not read again (producer/seeding.py)
    strict: bool = False  # any failed sitemap makes the exit code 3 (exit_code() in producer/__main__.py)
    discovery: DiscoveryArgs = field(
        default_factory=DiscoveryArgs
    )  # start URLs, depth, scope, budgets (discovery_scope.py)
    frontier: bool = False  # run the frontier service instead (producer/frontier_service.py)


def check_options(options: Options) -> None:
    if not RUN_ID_PATTERN.fullmatch(options.run_id):
        raise ConfigError(
            f"--run-id: use up to 64 letters, digits, '.', '-' or '_', got {options.run_id[:80]!r}"
        )
    if options.recrawl_of and not RUN_ID_PATTERN.fullmatch(options.recrawl_of):
        raise ConfigError(
            f"--recrawl-of: use up to 64 letters, digits, '.', '-' or '_', got {options.recrawl_of[:80]!r}"
        )
    if not (
        options.sitemaps or options.sites or options.url_files or options.urls or options.discovery.start_urls
    ):
        raise ConfigError("nothing to read: give at least one --sitemap, --site, --urls or --start")
    for flag, urls in (("--sitemap", options.sitemaps), ("--site", options.sites), ("url", options.urls)):
        for url in urls:
            try:
                canonicalize(url)
            except InvalidURL as exc:
                raise ConfigError(f"{flag} {url}: {exc.detail}") from None
    check_url_files(options.url_files)


def run(
    settings: Settings,
    options: Options,
    fetch: Fetch | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Read every input, publish what is new, and return the summary. Raises ConfigError or
    ServiceUnavailable (one line each) before any URL is published when set-up fails. Setting
    `stop` (or SIGTERM, SIGINT on the main thread) ends the run early, settled, as a signal does."""
    started = time.monotonic()
    check_options(options)
    discovery = checked_discovery(settings, options)
    router = load_router(options.routing_file or settings.routing_file)

    connection = broker.connect(settings, "producer-setup")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()

    client = connect_redis(settings, PRODUCER, ping=True)
    # Sitemaps and robots.txt go out through the same proxies as the workers' requests.
    fetcher = HttpFetcher(settings, proxies=ProxyPool.from_settings(settings, client))
    stop = stop or threading.Event()
    stop_signals: list[int] = []  # the signals that asked for the stop (SIGINT, SIGTERM)
    previous_run = PreviousRun(settings, options.recrawl_of) if options.recrawl_of else None
    reader = SitemapReader(fetch or fetcher, settings.max_sitemap_depth, settings.max_sitemap_bytes)
    dedup = Dedup(client, Keys(settings.redis_prefix), options.run_id)
    try:
        if discovery is not None:  # before any URL of the run: the frontier reads them
            store_options(settings, options.run_id, discovery)  # the copy a Redis restart keeps
            with translate_redis_errors(settings.redis_url):
                keep_options(client, Keys(settings.redis_prefix), options.run_id, discovery)
        with (
            translate_redis_errors(settings.redis_url),
            Heartbeat(dedup),
            ConfirmingPublisher(settings) as publisher,
        ):
            publisher.start()
            log.info("run %s: publishing; routing rules from %s", options.run_id, router.source)
            pipeline = Pipeline(
                options.run_id,
                settings.crawl_namespace,
                settings.publish_batch_size,
                router,
                DedupOverRedis(dedup, settings),
                publisher,
                sleep=stop.wait,  # a stop request cuts a pause short
                should_stop=stop.is_set,
                previous_run=previous_run,
                depth=0 if discovery is not None else None,
            )
            with (
                stop_on_sigterm(stop, stop_signals),
                showing_progress(options.run_id, pipeline.counts, reader),
            ):
                entries = all_entries(
                    reader, options.sitemaps, options.sites, options.url_files, options.urls
                )
                if discovery is not None:
                    entries = _after_start_urls(discovery, entries)
                counts = pipeline.run(spread_hosts(entries, settings.host_spread_window))
        if counts.stopped_early:
            log.warning(
                "run %s stopped before every input was read; run again with --run-id %s to finish it",
                options.run_id,
                options.run_id,
            )
    finally:
        fetcher.close()
        client.close()
        if previous_run is not None:
            previous_run.close()
    result = summary(options.run_id, counts, reader, time.monotonic() - started)
    result["interrupted"] = bool(stop_signals)
    result["stop_signal"] = signal.Signals(stop_signals[0]).name if stop_signals else None
    return result


def checked_discovery(settings: Settings, options: Options) -> DiscoveryOptions | None:
    """The run's discovery options, checked before anything is queued; None when it follows no links."""
    given = options.discovery
    return DiscoveryOptions.checked(
        given.start_urls,
        given.max_depth,
        given.scope,
        given.include,
        given.exclude,
        given.max_pages,
        given.max_pages_per_host,
        other_roots=(*options.sitemaps, *options.sites),
        check_address=check_url(settings),
    )


def _after_start_urls(discovery: DiscoveryOptions, entries: Iterator[SitemapEntry]) -> Iterator[SitemapEntry]:
    for url in discovery.start_urls:
        yield SitemapEntry(url=url, source="start")
    yield from entries


class DedupOverRedis:
    """Dedup whose lost Redis connection arrives as ServiceUnavailable at each call, where the
    pipeline can wait for Redis to come back, instead of ending the whole run."""

    def __init__(self, dedup: Dedup, settings: Settings) -> None:
        self._dedup = dedup
        self._settings = settings

    def claim(self, fingerprints: Sequence[bytes]) -> Claim:
        with translate_redis_errors(self._settings.redis_url):
            return self._dedup.claim(fingerprints)

    def confirm(self, fingerprints: Sequence[bytes], counters: dict[str, int] | None = None) -> None:
        with translate_redis_errors(self._settings.redis_url):
            self._dedup.confirm(fingerprints, counters)

    def release(self, fingerprints: Sequence[bytes], token: bytes) -> int:
        with translate_redis_errors(self._settings.redis_url):
            return self._dedup.release(fingerprints, token)


@contextlib.contextmanager
def stop_on_sigterm(stop: threading.Event, stop_signals: list[int]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT (Ctrl-C) set `stop` instead of killing the process: the
    pipeline then stops reading and settles its batches (confirmed URLs marked seen, the others
    released), so no URL is left claimed but unpublished, and the summary of what was done is
    printed as usual. Each signal received is appended to `stop_signals`: the first decides the
    exit code (130 for Ctrl-C, 143 for SIGTERM)."""

    def request_stop() -> None:
        log.warning("got signal %d: stopping after the batches in flight", stop_signals[-1])
        stop.set()

    with stop_signals_call(request_stop, stop_signals):
        yield


def summary(run_id: str, counts: Counts, reader: SitemapReader, elapsed_s: float) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "urls_seen": counts.urls_seen,
        "enqueued": dict(counts.enqueued),
        "enqueued_total": counts.enqueued_total,
        "duplicates": counts.duplicates,
        "not_due": counts.not_due,
        "invalid": dict(sorted(counts.invalid.items())),
        "publish_failed": counts.publish_failed,
        "taken_over": counts.taken_over,
        "republished": counts.republished,
        "left_claimed": counts.left_claimed,
        "unconfirmed": counts.unconfirmed,
        "confirm_wait_max_s": round(counts.confirm_wait_max_s, 3),
        "stopped_early": counts.stopped_early,
        "sitemaps_read": reader.sitemaps_read,
        "sitemaps_failed": [{"url": f.url, "error": f.error} for f in reader.failures],
        "sitemap_warnings": dict(sorted(reader.warnings.items())),
        "elapsed_s": round(elapsed_s, 3),
        "start_workers": START_WORKERS,
    }
