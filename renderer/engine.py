"""The bridge between the worker's handler threads and the browser's event loop.

The renderer runs the worker's own CrawlHandler (robots.txt, the domain gate, retries, the
store, dead letters): only its Fetch differs. Playwright's API is asyncio and not
thread-safe, so one thread runs an event loop holding the guarded proxy and the browser pool,
and each handler thread hands its page to that loop and waits for the answer. `RenderFetch`
is the handler's Fetch: `page()` renders, `robots_txt()` fetches robots.txt with the worker's
plain fetcher, as a worker would.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, TypeVar

from renderer.browser import BrowserOptions, BrowserPool
from renderer.chromium import require_chromium
from renderer.page import Rendered, RenderTimeout
from renderer.proxy import GuardedProxy
from renderer.watchdog import Watchdog
from shared import metrics
from shared.errors import ConfigError, one_line
from shared.http.netguard import AddressGuard
from shared.settings import Settings
from worker.fetch.response import CacheEntry, Response
from worker.politeness.robots import RobotsAnswer

log = logging.getLogger(__name__)

T = TypeVar("T")
BRIDGE_MARGIN_S = 15.0  # past the page's own deadline, before a handler thread stops waiting
RENDERED_TYPE = "text/html; charset=utf-8"  # page.content() is text: stored encoded as UTF-8


def browser_refused(reason: str, target: str) -> None:
    metrics.RENDER_REQUESTS_REFUSED.labels(reason).inc()
    log.debug("browser request refused (%s): %s", reason, target)


class RenderEngine:
    def __init__(
        self, settings: Settings, guard: AddressGuard, watchdog: Watchdog, *, route_check: bool = True
    ) -> None:
        self._settings = settings
        self._route_check = route_check
        self._guard = guard
        self._watchdog = watchdog
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="browser-loop", daemon=True)
        self._proxy = GuardedProxy(
            guard.addresses_for,
            max_body_bytes=settings.max_body_bytes,
            connect_timeout_s=settings.fetch_connect_timeout_s,
            idle_timeout_s=settings.render_deadline_s,
            refused=browser_refused,
        )
        self.pool: BrowserPool | None = None

    def start(self) -> RenderEngine:
        self._thread.start()
        port = self._run(self._proxy.start(), timeout_s=10)
        options = BrowserOptions(
            chromium_path=self._settings.chromium_path,
            proxy_port=port,
            slots=self._settings.render_concurrency,
            max_pages_per_context=self._settings.browser_max_pages,
            max_memory_bytes=self._settings.browser_max_rss_mb << 20,
            page_heap_mb=self._settings.render_page_heap_mb,
            route_check=self._route_check,
        )
        require_chromium(self._settings.chromium_path)
        self.pool = self._run(self._make_pool(options), timeout_s=10)
        try:
            self._run(self.pool.warm_up(), timeout_s=60)
        except Exception as exc:  # Playwright's launch errors, whatever their kind: one line
            raise ConfigError(
                f"CHROMIUM_PATH: {self._settings.chromium_path} did not start: {one_line(exc)}"
            ) from None
        return self

    async def _make_pool(self, options: BrowserOptions) -> BrowserPool:
        return BrowserPool(options, self._guard.check_url, self._watchdog, browser_refused)

    def render(self, url: str) -> Rendered:
        assert self.pool is not None, "start() first"
        deadline_s = self._settings.render_deadline_s
        try:
            return self._run(self.pool.render(url, deadline_s), timeout_s=deadline_s + BRIDGE_MARGIN_S)
        except FutureTimeout:
            raise RenderTimeout(f"the browser gave no answer within {deadline_s:g} s") from None

    def browser_memory_bytes(self) -> int:
        return self.pool.browser_memory_bytes() if self.pool is not None else 0

    def close(self) -> None:
        if self.pool is not None:
            self._run(self.pool.close(), timeout_s=30)
        self._run(self._proxy.close(), timeout_s=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=timeout_s)


class Renders(Protocol):
    def render(self, url: str) -> Rendered: ...


class RenderFetch:
    """The handler's Fetch in a renderer. `count` is told each render's outcome and its
    milliseconds (renderer/figures.py: the run's figures)."""

    def __init__(
        self,
        engine: Renders,
        robots_txt: Callable[[str], RobotsAnswer],
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self._engine = engine
        self._robots_txt = robots_txt
        self._count = count

    def page(self, url: str, revalidate: CacheEntry | None) -> Response:
        started = time.monotonic()
        try:
            rendered = self._engine.render(url)
        except Exception as exc:
            reason = getattr(exc, "reason", "error")
            metrics.RENDERS.labels(reason).inc()
            self._counted(reason, started)
            raise
        outcome = "ok" if rendered.settled else "unsettled"
        metrics.RENDERS.labels(outcome).inc()
        metrics.observe_fetch(time.monotonic() - started, rendered.status)
        self._counted(outcome, started)
        return Response(
            final_url=rendered.final_url,
            status=rendered.status,
            content_type=RENDERED_TYPE,
            body=rendered.html.encode("utf-8", "replace"),
            fetch_ms=rendered.render_ms,
        )

    def robots_txt(self, url: str) -> RobotsAnswer:
        return self._robots_txt(url)

    def _counted(self, outcome: str, started: float) -> None:
        if self._count is not None:
            self._count(outcome, int((time.monotonic() - started) * 1000))
