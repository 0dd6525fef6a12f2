"""What a worker does with one delivery: `CrawlHandler.__call__(delivery) -> Outcome`.

Free of pika: it returns what to publish and whether to ack, and the shared consumer loop does
it. The order of work for a URL: decode → robots.txt (skip if disallowed) → response cache
(fresh: done; stale: revalidate) → domain gate (rate, concurrency, pause) → fetch → parse →
commit → (ack). Transient failures go to a delay queue with the attempt count in our own
header; the last allowed failure, or a permanent one, goes to the dead-letter exchange. A URL
the domain cannot take now (TryLater) goes to a delay queue without being charged an attempt:
never dropped, never acked unprocessed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from shared.broker import Publication
from shared.consumer import Delivery, Outcome
from shared.errors import DecodeError, PermanentError, TaskError, TransientError
from shared.messages import CrawlTask, Failure, Progress
from shared.settings import Settings
from shared.topology import Topology, dead_letter_exchange, delay_routing_key, retry_exchange
from shared.urls import domain_of
from worker.parse import ParsedPage, decode_html, parse_page
from worker.poison import DeliveryLimit
from worker.politeness import TryLater
from worker.robots import RobotsAnswer, RobotsRules
from worker.store import PageRow, SkipRow

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Response:
    """A response to parse, whether just fetched or from the cache."""

    final_url: str
    status: int
    content_type: str
    body: bytes
    fetch_ms: int | None
    from_cache: bool  # the body came from the cache (fresh, or revalidated by a 304)
    not_modified: bool = False  # a 304 answered our conditional request
    proxy: str | None = None  # the proxy it came through, without credentials
    etag: str | None = None
    last_modified: str | None = None


@dataclass(frozen=True)
class CacheEntry:
    response: Response  # as cached
    fresh: bool  # young enough to use without asking the server


@dataclass(frozen=True)
class PageSource:
    """How a stored page was obtained, beyond what PageRow says."""

    not_modified: bool
    proxy: str | None


class Fetch(Protocol):
    def page(self, url: str, revalidate: CacheEntry | None) -> Response:
        """GET `url`; conditional when `revalidate` has validators (then a 304 has no body)."""
        ...

    def robots_txt(self, url: str) -> RobotsAnswer: ...


class Cache(Protocol):
    def get(self, url: str) -> CacheEntry | None: ...

    def put(self, url: str, response: Response) -> None: ...


class Gate(Protocol):
    """worker.politeness.DomainGate: every request to a domain goes through it."""

    def call(self, domain: str, send: Callable[[], T], crawl_delay_s: float | None = None) -> T: ...


class Robots(Protocol):
    def rules_for(self, url: str, fetch: Callable[[str], RobotsAnswer]) -> RobotsRules: ...


class Store(Protocol):
    def save_page(self, row: PageRow, source: PageSource) -> None: ...

    def save_skip(self, row: SkipRow) -> None: ...


@dataclass
class CrawlHandler:
    settings: Settings
    topology: Topology
    fetch_for_thread: Callable[[], Fetch]  # one fetcher (HTTP session) per handler thread
    cache: Cache
    gate: Gate
    robots: Robots
    store: Store
    clock: Callable[[], float] = time.time
    delivery_limit: DeliveryLimit | None = None  # bounds redeliveries of a crash-looping message

    def __post_init__(self) -> None:
        self._local = threading.local()

    def __call__(self, delivery: Delivery) -> Outcome:
        if self.delivery_limit is not None and (too_often := self.delivery_limit.check(delivery)):
            return too_often
        progress = Progress.from_headers(delivery.headers)
        try:
            task = CrawlTask.decode(delivery.body)
        except DecodeError as exc:
            log.warning("undecodable message on %s: %s", delivery.queue, exc.detail)
            return self._dead_letter(delivery.body, "", progress, exc)
        try:
            return self._crawl(task, progress)
        except TryLater as later:
            return self._defer(delivery.body, task, progress, later)
        except TransientError as exc:
            failed = progress.failed_once_more(self.clock())
            if failed.attempt >= self.settings.max_attempts:
                return self._dead_letter(delivery.body, task.queue, failed, exc, task.url)
            return self._retry(delivery.body, task, failed, exc)
        except PermanentError as exc:
            failed = progress.failed_once_more(self.clock())
            return self._dead_letter(delivery.body, task.queue, failed, exc, task.url)

    def _crawl(self, task: CrawlTask, progress: Progress) -> Outcome:
        rules = self._robots_rules(task.url)
        if rules is not None and not rules.allows(task.url):
            self.store.save_skip(
                SkipRow(task.run_id, task.url, "robots", "disallowed by robots.txt", self.settings.worker_id)
            )
            log.info("skipped %s: disallowed by robots.txt", task.url)
            return Outcome.done()
        response = self._response_for(task.url, rules)
        page = parse_page(decode_html(response.body, response.content_type), response.final_url)
        self.store.save_page(
            self._row(task, response, page, progress), PageSource(response.not_modified, response.proxy)
        )
        log.info(
            "stored %s status=%d cache=%s not_modified=%s attempt=%d",
            task.url,
            response.status,
            response.from_cache,
            response.not_modified,
            progress.attempt + 1,
        )
        return Outcome.done()

    def _robots_rules(self, url: str) -> RobotsRules | None:
        if not self.settings.respect_robots:
            return None
        domain = domain_of(url)

        def fetch_robots(robots_url: str) -> RobotsAnswer:
            fetcher = self._fetcher()  # made before the slot: a new session takes time
            return self.gate.call(domain, lambda: fetcher.robots_txt(robots_url))

        return self.robots.rules_for(url, fetch_robots)

    def _response_for(self, url: str, rules: RobotsRules | None) -> Response:
        """From the cache while fresh; else fetched (conditionally, if cached) through the gate."""
        cached = self.cache.get(url)
        if cached is not None and cached.fresh:
            return cached.response
        crawl_delay_s = rules.crawl_delay_s if rules is not None else None
        fetcher = self._fetcher()
        fetched = self.gate.call(domain_of(url), lambda: fetcher.page(url, cached), crawl_delay_s)
        if fetched.not_modified:
            if cached is None:  # the fetcher only asks conditionally with an entry to revalidate
                raise PermanentError("http_304", "not modified, but nothing was cached", 304)
            fetched = dataclasses.replace(
                cached.response,
                fetch_ms=fetched.fetch_ms,
                from_cache=True,
                not_modified=True,
                proxy=fetched.proxy,
                etag=fetched.etag or cached.response.etag,
                last_modified=fetched.last_modified or cached.response.last_modified,
            )
        if fetched.status == 200:
            self.cache.put(url, fetched)  # after a 304 too: the entry is fresh again
        return fetched

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

    def _defer(self, body: bytes, task: CrawlTask, progress: Progress, later: TryLater) -> Outcome:
        """The domain cannot take the URL for longer than we wait in-process: back through a
        delay queue, with no attempt charged. The message is acked only once its copy is confirmed."""
        delay_ms = self.topology.delay_ms_for(later.wait_s)
        log.debug("deferring %s by %dms (%s)", task.url, delay_ms, later.reason)
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
