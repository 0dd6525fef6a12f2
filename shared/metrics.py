"""Every Prometheus metric of the pipeline, defined here and nowhere else.

Services import the metric objects from this module and call `start_metrics_server(settings)`
once in main(); with METRICS_PORT=0 (the default) no server starts and the metrics are plain
in-process counters that cost next to nothing. Each process serves only its own figures:
Prometheus adds them up across workers (``sum(rate(...))``).

Where each metric is counted (label values in brackets):

    worker
      PAGES_STORED[queue]          once a page's row is committed, once per stored page
      SKIPS[reason]                after store.save_skip() committed (robots, blocked_address, ...)
      FETCH_SECONDS                around each HTTP request of a page, revalidations included
                                   (not robots.txt): observe(seconds), also for failed fetches
      HTTP_RESPONSES[code]         every HTTP answer to a page fetch, by status code ("200",
                                   "304", "404", "503", ...); a fetch with no answer counts nothing
      RETRIES[reason]              when a transient failure is sent to a retry queue
                                   (worker/handling/forwards.py)
      CACHE_HITS                   a page answered from a fresh cache entry, without a request
      NOT_MODIFIED                 a 304 that revalidated a cached entry
      RATE_LIMIT_WAITS             each request the domain gate held back in-process (its rate,
      RATE_LIMIT_WAIT_SECONDS        concurrency cap or pause): inc() once per request that slept,
                                   and add the seconds it slept (worker/politeness/gate_waits.py)
      DEFERRALS[reason]            a URL sent to a defer queue because it could not be served
                                   soon enough (TryLater: rate, paused, busy, spacing,
                                   robots_pending, proxies_benched); no attempt charged
      FETCHES_IN_FLIGHT            inc() when a handler thread starts on a delivery, dec() when
                                   it returns an outcome (``with FETCHES_IN_FLIGHT.track_inprogress()``)
      PRODUCER_COPIES_RECEIVED     a producer's message at its first delivery (no headers, not
                                   redelivered): each message the broker got from a producer, once
      PROXY_FAILURES[proxy]        a request that failed for its proxy's fault (shared/http/proxies.py);
                                   proxy = scheme://host:port, never credentials
      PROXY_USABLE[proxy]          1 while the proxy is in use, 0 while benched, as this worker last
                                   saw it (each choice of a proxy reads every proxy's bench)
      DUPLICATE_DELIVERIES[kind]   a delivery of a URL already settled, acked unfetched
                                   (worker/handling/handled.py): second_copy (another message the producer
                                   published), redelivered (the same message again), forwarded
                                   (a retry or deferral copy)

    every consumer (the shared consumer loop, so worker and dlq_consumer alike)
      MESSAGES_CONSUMED[queue]     each delivery taken from a queue, redeliveries included
      MESSAGES_HELD                inc() when a handler holds a message unacked to try it again
                                   later (Outcome.hold), dec() when it goes back to a handler
      HOLDS[reason]                worker: a URL held in-process for its domain (rate, busy,
                                   spacing, ...), where it would otherwise be deferred; parked:
                                   held as it came, behind a slot of its domain held here

    dlq_consumer
      DEAD_LETTERS[reason]         after a dead letter's row is committed.
                                   Counted only here, where broker expiries (`expired`) arrive
                                   too; the worker does not count its dead-letter publishes.

    producer (producer/pipeline.py and producer/in_flight.py; a finished producer serves them
    until scraped once, producer/final_scrape.py)
      URLS_ENQUEUED[queue]         URLs whose publish the broker confirmed, as each batch settles
      URL_DUPLICATES               URLs the dedup step found already seen, as each batch settles
      URLS_INVALID[reason]         URLs rejected by canonicalisation, as each is read

Names follow Prometheus conventions: base units (seconds), ``_total`` added to counters by the
client library. Labels have small fixed value sets (queues, reasons, status codes); never put
a URL or domain in a label, which would create a series per page (a proxy's label is one of
the few configured proxies).
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.registry import Collector

from shared.errors import ConfigError
from shared.metrics_server import MetricsServer, serve_metrics
from shared.settings import Settings

log = logging.getLogger(__name__)

# From a fast local page to the 30 s default FETCH_DEADLINE_S.
FETCH_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

# Worker.
PAGES_STORED = Counter("crawl_pages_stored", "Pages committed to PostgreSQL.", ["queue"])
SKIPS = Counter("crawl_skips", "URLs recorded as skipped instead of fetched.", ["reason"])
FETCH_SECONDS = Histogram(
    "crawl_fetch_duration_seconds", "Time of one HTTP fetch of a page.", buckets=FETCH_BUCKETS_S
)
HTTP_RESPONSES = Counter("crawl_http_responses", "HTTP answers to page fetches, by status code.", ["code"])
RETRIES = Counter("crawl_retries", "Transient failures sent to a retry queue for another try.", ["reason"])
CACHE_HITS = Counter("crawl_cache_hits", "Pages answered from a fresh cache entry, without a request.")
NOT_MODIFIED = Counter("crawl_not_modified", "Cached pages revalidated by a 304 answer.")
RATE_LIMIT_WAITS = Counter("crawl_rate_limit_waits", "In-process waits for a domain's rate limit.")
RATE_LIMIT_WAIT_SECONDS = Counter("crawl_rate_limit_wait_seconds", "Seconds spent in rate-limit waits.")
DEFERRALS = Counter(
    "crawl_deferrals", "URLs sent to a defer queue to wait, no failure and no attempt charged.", ["reason"]
)
FETCHES_IN_FLIGHT = Gauge("crawl_fetches_in_flight", "Deliveries a worker process is working on now.")
PROXY_FAILURES = Counter("crawl_proxy_failures", "Requests that failed for their proxy's fault.", ["proxy"])
PROXY_USABLE = Gauge("crawl_proxy_usable", "1 while a proxy is in use, 0 while it is benched.", ["proxy"])

PRODUCER_COPIES_RECEIVED = Counter(
    "crawl_copies_received", "Producer messages at their first delivery to a worker."
)
DUPLICATE_DELIVERIES = Counter(
    "crawl_duplicate_deliveries", "Deliveries of a URL already settled, acked unfetched.", ["kind"]
)

# Renderer (and the worker's routing of script shells to it).
RENDERS = Counter("crawl_renders", "Pages rendered in a browser, by outcome.", ["outcome"])
RENDER_REQUESTS_REFUSED = Counter(
    "crawl_render_requests_refused", "Requests of a rendered page refused by the guards.", ["reason"]
)
SENT_TO_RENDER = Counter(
    "crawl_sent_to_render", "URLs sent to the render queue instead of being stored.", ["reason"]
)
BROWSER_RSS_BYTES = Gauge(
    "crawl_browser_rss_bytes", "Memory (PSS) of a renderer's browser, all its processes."
)

# Every consumer.
MESSAGES_HELD = Gauge("crawl_messages_held", "Messages held unacked in-process until they are due.")
HOLDS = Counter("crawl_holds", "URLs held in-process to wait for their domain, not deferred.", ["reason"])
MESSAGES_CONSUMED = Counter("crawl_messages_consumed", "Deliveries taken from a queue.", ["queue"])

# Dead-letter consumer.
DEAD_LETTERS = Counter("crawl_dead_letters", "Dead letters recorded in PostgreSQL.", ["reason"])

# Producer.
URLS_ENQUEUED = Counter("crawl_producer_urls_enqueued", "URLs published and confirmed.", ["queue"])
URL_DUPLICATES = Counter("crawl_producer_duplicates", "URLs not published because already seen.")
URLS_INVALID = Counter("crawl_producer_invalid_urls", "URLs rejected by canonicalisation.", ["reason"])


def observe_fetch(seconds: float, status: int | None) -> None:
    """One page fetch: its duration, and its status code when the server answered at all."""
    FETCH_SECONDS.observe(seconds)
    if status is not None:
        HTTP_RESPONSES.labels(str(status)).inc()


def start_metrics_server(settings: Settings, registry: Collector = REGISTRY) -> MetricsServer | None:
    """Serve /metrics on METRICS_HOST:METRICS_PORT from a daemon thread; None when the port is 0.

    The server thread never blocks the service, and dies with it. The server is returned so that
    a caller (a test) can shut it down. `registry` is what is served: the default registry, or
    a wrapper of it (the producer's, which notices scrapes)."""
    if settings.metrics_port == 0:
        return None
    try:
        server = serve_metrics(settings.metrics_host, settings.metrics_port, registry)
    except OSError as exc:
        # Typically a second process on one machine with the same port: say which setting to change.
        raise ConfigError(
            f"METRICS_PORT: cannot listen on {settings.metrics_host}:{settings.metrics_port}: "
            f"{exc.strerror or exc}"
        ) from None
    log.info("serving metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return server
