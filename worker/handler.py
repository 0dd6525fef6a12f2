"""What a worker does with one delivery: `CrawlHandler.__call__(delivery) -> Outcome`.

Free of pika: it returns what to publish and whether to ack, and the shared consumer loop does
it. The order of work for a URL: decode → response cache → per-domain rate limit → fetch →
parse → commit → (ack). Transient failures go to a delay queue with the attempt count in our
own header; the last allowed failure, or a permanent one, goes to the dead-letter exchange.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shared.broker import Publication
from shared.consumer import Delivery, Outcome
from shared.errors import DecodeError, PermanentError, TaskError, TransientError
from shared.messages import CrawlTask, Failure, Progress
from shared.settings import Settings
from shared.topology import Topology, dead_letter_exchange, delay_routing_key, retry_exchange
from shared.urls import domain_of
from worker.parse import ParsedPage, decode_html, parse_page
from worker.store import PageRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    """A response to parse, whether just fetched or from the cache."""

    final_url: str
    status: int
    content_type: str
    body: bytes
    fetch_ms: int | None
    from_cache: bool


@dataclass(frozen=True)
class Deferred:
    """The domain is busy for longer than a handler thread should wait."""

    wait_s: float


class Fetch(Protocol):
    def __call__(self, url: str) -> Response: ...


class Cache(Protocol):
    """Read side of the response cache; the fetcher writes fresh responses into it."""

    def get(self, url: str) -> Response | None: ...


class RateLimit(Protocol):
    def wait_s(self, domain: str) -> tuple[float, bool]:
        """(seconds to wait, whether a slot was reserved for this caller)."""
        ...


class Store(Protocol):
    def save_page(self, row: PageRow) -> None: ...


@dataclass
class CrawlHandler:
    settings: Settings
    topology: Topology
    fetch_for_thread: Callable[[], Fetch]  # one fetcher (HTTP session) per handler thread
    cache: Cache
    rate_limit: RateLimit
    store: Store
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._local = threading.local()

    def __call__(self, delivery: Delivery) -> Outcome:
        progress = Progress.from_headers(delivery.headers)
        try:
            task = CrawlTask.decode(delivery.body)
        except DecodeError as exc:
            log.warning("undecodable message on %s: %s", delivery.queue, exc.detail)
            return self._dead_letter(delivery.body, delivery.queue, progress, exc)
        try:
            response = self._response_for(task)
            if isinstance(response, Deferred):
                return self._defer(delivery.body, task, progress, response.wait_s)
            page = parse_page(decode_html(response.body, response.content_type), response.final_url)
        except TransientError as exc:
            failed = progress.failed_once_more(self.clock())
            if failed.attempt >= self.settings.max_attempts:
                return self._dead_letter(delivery.body, task.queue, failed, exc, task.url)
            return self._retry(delivery.body, task, failed, exc)
        except PermanentError as exc:
            failed = progress.failed_once_more(self.clock())
            return self._dead_letter(delivery.body, task.queue, failed, exc, task.url)
        self.store.save_page(self._row(task, response, page, progress))
        log.info(
            "stored %s status=%d cache=%s attempt=%d",
            task.url,
            response.status,
            response.from_cache,
            progress.attempt + 1,
        )
        return Outcome.done()

    def _response_for(self, task: CrawlTask) -> Response | Deferred:
        """The response from the cache, or fetched once the domain's rate limit allows."""
        cached = self.cache.get(task.url)
        if cached is not None:
            return cached
        wait_s, reserved = self.rate_limit.wait_s(domain_of(task.url))
        if not reserved:
            return Deferred(wait_s)
        if wait_s > 0:
            self.sleep(wait_s)
        return self._fetcher()(task.url)

    def _fetcher(self) -> Fetch:
        fetcher: Fetch | None = getattr(self._local, "fetcher", None)
        if fetcher is None:
            fetcher = self._local.fetcher = self.fetch_for_thread()
        return fetcher

    def _retry(self, body: bytes, task: CrawlTask, failed: Progress, exc: TaskError) -> Outcome:
        delay_ms = self.topology.delay_ms_for(self.settings.retry_delay_s(failed.attempt))
        log.info("retrying %s in %dms after attempt %d: %s", task.url, delay_ms, failed.attempt, exc)
        return Outcome.forward(
            Publication(
                retry_exchange(self.topology.namespace),
                delay_routing_key(delay_ms, task.queue),
                body,
                failed.to_headers(),
                task.priority or None,
            )
        )

    def _defer(self, body: bytes, task: CrawlTask, progress: Progress, wait_s: float) -> Outcome:
        """Over the domain's rate for longer than we wait in-process: back through a delay queue,
        with no attempt charged. The message is acked only once its copy is confirmed."""
        delay_ms = self.topology.delay_ms_for(wait_s)
        log.debug("deferring %s by %dms (rate limit)", task.url, delay_ms)
        return Outcome.forward(
            Publication(
                retry_exchange(self.topology.namespace),
                delay_routing_key(delay_ms, task.queue),
                body,
                progress.to_headers(),
                task.priority or None,
            )
        )

    def _dead_letter(
        self, body: bytes, origin: str, progress: Progress, exc: TaskError, url: str = ""
    ) -> Outcome:
        log.warning("dead-lettering %s after %d attempts: %s", url or "<undecodable>", progress.attempt, exc)
        failure = Failure(exc.reason, exc.detail, exc.http_status, origin, self.settings.worker_id)
        return Outcome.forward(
            Publication(
                dead_letter_exchange(self.topology.namespace),
                origin,
                body,
                {**progress.to_headers(), **failure.to_headers()},
            )
        )

    def _row(self, task: CrawlTask, response: Response, page: ParsedPage, progress: Progress) -> PageRow:
        return PageRow(
            run_id=task.run_id,
            url=task.url,
            final_url=response.final_url,
            http_status=response.status,
            content_type=response.content_type,
            title=page.title,
            meta_description=page.description,
            canonical_url=page.canonical_url,
            lang=page.lang,
            h1=page.h1,
            body_text=page.text,
            links=list(page.links),
            queue=task.queue,
            failed_attempts=progress.attempt,
            from_cache=response.from_cache,
            fetch_ms=response.fetch_ms,
            worker_id=self.settings.worker_id,
        )
