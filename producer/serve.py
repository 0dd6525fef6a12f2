"""`python -m producer --serve`: the producer as a long-running service, seeding each crawl
request (shared/crawl_request.py) that `ops.submit` or the dashboard put in the control queue.

Each request is seeded as `python -m producer --once --run-id <its run>` would: the same
reading, dedup and publishing (producer/service.py), then the run is marked seeded. The request
is acked only once its run is seeded to the end. A service killed mid-seeding leaves the
request unacked, the broker hands it out again, and the next seeding of the same run id takes
the dead producer's claims over once its heartbeat lapses, as a rerun with the same `--run-id`
does: no URL is lost, and any published twice is absorbed by the workers' handled marks. A
request whose run was seeded before (killed between the mark and the ack) is acked at once.

One request at a time (concurrency 1; the broker's prefetch keeps a second one waiting here,
unacked, and it goes back to the queue if the service dies). A stop (SIGTERM, Ctrl-C) ends the
seeding in progress settled, and gives its request back to the queue for the next start. A
request that does not decode, or that names an address the guard refuses, is dead-lettered to
the parked queue with one log line, never retried.

A seeding longer than RabbitMQ's consumer_timeout (30 min by default) has its channel closed
by the broker and the request handed out again; this service then finds the run seeded, or
resumes it, so nothing is lost, but such crawls should raise consumer_timeout on the broker.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from producer.discovery_args import DiscoveryArgs
from producer.seeding import mark_seeded, seeded_summary
from producer.service import Options, run
from shared.amqp import broker
from shared.amqp.topology import build_topology, control_queue
from shared.consumer import Delivery, Outcome, StopEvent, Subscription, run_consumers
from shared.crawl_request import CrawlRequest, InvalidRequest, check
from shared.errors import DecodeError
from shared.http.netguard import check_url
from shared.metrics import start_metrics_server
from shared.settings import Settings

log = logging.getLogger(__name__)

SERVICE_NAME = "producer-service"

Seed = Callable[[Settings, Options, threading.Event], dict[str, Any]]


def _seed(settings: Settings, options: Options, stop: threading.Event) -> dict[str, Any]:
    return run(settings, options, stop=stop)


class RequestSeeder:
    """The handler: decode a request, seed its run, and say whether to ack it."""

    def __init__(
        self,
        settings: Settings,
        stop: threading.Event,
        seed: Seed = _seed,
        already_seeded: Callable[[Settings, str], dict[str, Any] | None] = seeded_summary,
        mark: Callable[[Settings, str, dict[str, Any]], None] = mark_seeded,
    ) -> None:
        self._settings = settings
        self._stop = stop
        self._seed = seed
        self._already_seeded = already_seeded
        self._mark = mark
        self._check_url = check_url(settings)

    def __call__(self, delivery: Delivery) -> Outcome:
        try:
            request = CrawlRequest.decode(delivery.body)
            check(request, self._check_url)
        except (DecodeError, InvalidRequest) as exc:
            log.error("crawl request refused, kept in the parked queue: %s", exc)
            return Outcome.reject(requeue=False)
        again = " (delivered again)" if delivery.redelivered else ""
        if (earlier := self._already_seeded(self._settings, request.run_id)) is not None:
            log.info(
                "crawl request %s: run %s was seeded at %s%s; nothing to do",
                request.request_id,
                request.run_id,
                earlier.get("seeded_at"),
                again,
            )
            return Outcome.done()
        log.info("crawl request %s: seeding run %s%s", request.request_id, request.run_id, again)
        result = self._seed(self._settings, options_for(request), self._stop)
        log.info("crawl request %s: %s", request.request_id, json.dumps(result))
        if result["publish_failed"] or result["stopped_early"] or result["left_claimed"]:
            # Not seeded to the end: the request goes back to the queue, and the next seeding of
            # the run (here after a stop, or on another service) resumes it.
            log.warning(
                "crawl request %s: run %s not seeded to the end; the request goes back to its queue",
                request.request_id,
                request.run_id,
            )
            return Outcome.reject(requeue=True)
        if not result["sitemaps_failed"]:
            self._mark(self._settings, request.run_id, result)
        else:  # what could be read is queued; a request sent again reads the failed ones again
            log.warning(
                "crawl request %s: %d sitemaps could not be read; the URLs of the others are queued",
                request.request_id,
                len(result["sitemaps_failed"]),
            )
        return Outcome.done()


def options_for(request: CrawlRequest) -> Options:
    return Options(
        run_id=request.run_id,
        sitemaps=request.sitemaps,
        sites=request.sites,
        urls=request.urls,
        recrawl_of=request.recrawl_of or "",
        once=True,
        discovery=DiscoveryArgs(
            start_urls=request.start_urls,
            max_depth=request.max_depth,
            scope=request.scope,
            include=request.include,
            exclude=request.exclude,
            max_pages=request.max_pages,
            max_pages_per_host=request.max_pages_per_host,
        ),
    )


def serve(settings: Settings) -> int:
    """Consume crawl requests until SIGTERM/SIGINT; return the exit code."""
    connection = broker.connect(settings, "producer-service-setup")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()
    start_metrics_server(settings)
    stop = StopEvent()
    queue = control_queue(settings.crawl_namespace)
    log.info("producer service: seeding the crawl requests of %s", queue)
    return run_consumers(
        settings,
        SERVICE_NAME,
        [Subscription(queue)],
        RequestSeeder(settings, stop),
        concurrency=1,
        stop_event=stop,
    )
