"""One producer run, wired up: settings and options in, the JSON-ready summary out."""

from __future__ import annotations

import datetime
import logging
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.dedup import Dedup, connect_redis, redis_errors
from producer.fetch import Fetch, HttpFetcher
from producer.pipeline import Counts, Pipeline
from producer.publisher import ConfirmingPublisher
from producer.routing import load_router
from producer.sitemaps import SitemapReader
from producer.sources import all_entries, check_url_files
from shared import broker
from shared.errors import ConfigError
from shared.keys import Keys
from shared.settings import Settings
from shared.topology import build_topology
from shared.urls import InvalidURL, canonicalize

log = logging.getLogger(__name__)

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # it becomes part of Redis keys
START_WORKERS = (
    "python -m worker  (as many as you like, plus python -m dlq_consumer; "
    "or all in one: make crawl SITEMAP=<url>)"
)


def new_run_id() -> str:
    """e.g. 20250101-120000-3fa2c1: sortable by start time, unique across parallel starts."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Options:
    run_id: str = field(default_factory=new_run_id)
    sitemaps: Sequence[str] = ()
    sites: Sequence[str] = ()
    url_files: Sequence[str] = ()
    routing_file: str = ""  # overrides Settings.routing_file


def check_options(options: Options) -> None:
    if not RUN_ID_PATTERN.fullmatch(options.run_id):
        raise ConfigError(f"--run-id: use up to 64 letters, digits, '.', '-' or '_', got {options.run_id!r}")
    if not (options.sitemaps or options.sites or options.url_files):
        raise ConfigError("nothing to read: give at least one --sitemap, --site or --urls")
    for flag, urls in (("--sitemap", options.sitemaps), ("--site", options.sites)):
        for url in urls:
            try:
                canonicalize(url)
            except InvalidURL as exc:
                raise ConfigError(f"{flag} {url}: {exc.detail}") from None
    check_url_files(options.url_files)


def run(settings: Settings, options: Options, fetch: Fetch | None = None) -> dict[str, Any]:
    """Read every input, publish what is new, and return the summary. Raises ConfigError or
    ServiceUnavailable (one line each) before any URL is published when set-up fails."""
    started = time.monotonic()
    check_options(options)
    router = load_router(options.routing_file or settings.routing_file)

    connection = broker.connect(settings, "producer-setup")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()

    client = connect_redis(settings)
    fetcher = HttpFetcher(settings)
    reader = SitemapReader(fetch or fetcher, settings.max_sitemap_depth, settings.max_sitemap_bytes)
    try:
        with redis_errors(settings), ConfirmingPublisher(settings) as publisher:
            publisher.start()
            log.info("run %s: publishing; routing rules from %s", options.run_id, router.source)
            pipeline = Pipeline(
                options.run_id,
                settings.crawl_namespace,
                settings.publish_batch_size,
                router,
                Dedup(client, Keys(settings.redis_prefix), options.run_id),
                publisher,
            )
            counts = pipeline.run(all_entries(reader, options.sitemaps, options.sites, options.url_files))
    finally:
        fetcher.close()
        client.close()
    return summary(options.run_id, counts, reader, time.monotonic() - started)


def summary(run_id: str, counts: Counts, reader: SitemapReader, elapsed_s: float) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "urls_seen": counts.urls_seen,
        "enqueued": dict(counts.enqueued),
        "enqueued_total": counts.enqueued_total,
        "duplicates": counts.duplicates,
        "invalid": dict(sorted(counts.invalid.items())),
        "publish_failed": counts.publish_failed,
        "sitemaps_read": reader.sitemaps_read,
        "sitemaps_failed": [{"url": f.url, "error": f.error} for f in reader.failures],
        "elapsed_s": round(elapsed_s, 3),
        "start_workers": START_WORKERS,
    }
