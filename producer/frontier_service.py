"""`python -m producer --frontier`: the frontier of discovery runs, as a service.

It consumes the discovery queue one message at a time (each the links of one or more stored
pages), and hands each to producer/frontier.py, which publishes what is new through the
producer's own pipeline. The message is acked once that pipeline has settled every link:
confirmed and marked seen, or released. One frontier is enough for a crawl (its cost is a few
microseconds a link and a share of a few Redis calls a message); several may run, as several
producers may, on the same claims.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets

import redis

from producer.dedup import Dedup
from producer.discovery_store import stored_options
from producer.frontier import Frontier
from producer.frontier_redis import PagesInHand, RedisFrontierState
from producer.liveness import Heartbeat
from producer.pipeline import Pipeline, PipelineThreads
from producer.pipeline_types import Counts
from producer.publisher import ConfirmingPublisher
from producer.routing import Router, load_router
from producer.service import DedupOverRedis
from producer.sitemaps import SitemapEntry
from shared.amqp.topology import discovery_queue
from shared.consumer import ConsumerHooks, Delivery, Outcome, Subscription, run_consumers
from shared.errors import DecodeError
from shared.links_message import decode_pages
from shared.redis.client import PRODUCER, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings

log = logging.getLogger(__name__)

SERVICE_NAME = "frontier"


class FrontierHandler:
    """Decode a page's links, follow them, ack: the consumer loop's handler."""

    def __init__(
        self, settings: Settings, client: redis.Redis, publisher: ConfirmingPublisher, router: Router
    ) -> None:
        self._settings = settings
        self._client = client
        self._keys = Keys(settings.redis_prefix)
        self._publisher = publisher
        self._router = router
        self._owner = secrets.token_hex(6)  # one owner for every run's claims
        self._dedups: dict[str, Dedup] = {}
        self._beats = contextlib.ExitStack()
        self._threads = PipelineThreads()  # every page's pipeline runs on the same two
        state = RedisFrontierState(client, self._keys, functools.partial(stored_options, settings))
        self._frontier = Frontier(state, self._enqueue)
        self._in_hand = PagesInHand(client, self._keys, self._owner)

    def __call__(self, delivery: Delivery) -> Outcome:
        try:
            pages = decode_pages(delivery.body)
        except DecodeError as exc:
            log.warning("links message dropped: %s: %s", exc.reason, exc.detail)
            return Outcome.reject(requeue=False)
        with translate_redis_errors(self._settings.redis_url):
            for run_id in {page.run_id for page in pages}:
                self._in_hand.hold(run_id)
            outcome = self._frontier.take(pages)
        first = pages[0]
        log.info(
            "links of %s run=%s depth=%d: %d enqueued, cut %s",
            first.page if len(pages) == 1 else f"{len(pages)} pages from {first.page}",
            first.run_id,
            first.depth,
            outcome.enqueued,
            dict(outcome.cut),
        )
        return Outcome.done()

    def _enqueue(self, run_id: str, depth: int, entries: list[SitemapEntry]) -> Counts:
        pipeline = Pipeline(
            run_id,
            self._settings.crawl_namespace,
            self._settings.publish_batch_size,
            self._router,
            DedupOverRedis(self._dedup(run_id), self._settings),
            self._publisher,
            depth=depth,
            threads=self._threads,
        )
        return pipeline.run(entries)

    def _dedup(self, run_id: str) -> Dedup:
        dedup = self._dedups.get(run_id)
        if dedup is None:
            dedup = self._dedups[run_id] = Dedup(self._client, self._keys, run_id, self._owner)
            self._beats.enter_context(Heartbeat(dedup))
        return dedup

    def idle(self) -> None:
        """No page waiting: the runs' marks go (PagesInHand)."""
        self._in_hand.release_all()

    def close(self) -> None:
        self._in_hand.release_all()
        self._beats.close()
        self._threads.close()


def serve(settings: Settings) -> int:
    """Run the frontier until SIGTERM/SIGINT; return the exit code. It serves no metrics of its
    own (its counts are the run's, in Redis): ops.crawl gives METRICS_PORT to the others."""
    client = connect_redis(settings, PRODUCER, ping=True)
    router = load_router(settings.routing_file)
    with ConfirmingPublisher(settings) as publisher:
        publisher.start()
        handler = FrontierHandler(settings, client, publisher, router)
        try:
            return run_consumers(
                settings,
                SERVICE_NAME,
                [Subscription(discovery_queue(settings.crawl_namespace))],
                handler,
                concurrency=1,
                hooks=ConsumerHooks(when_idle=handler.idle),
            )
        finally:
            handler.close()
            client.close()
