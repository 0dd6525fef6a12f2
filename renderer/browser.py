"""One Chromium per renderer process, with a fixed number of pages in flight.

The browser holds RENDER_CONCURRENCY slots; a page is rendered in a slot's own context, so
pages in flight never share cookies, storage or a cache. A slot's context serves pages one after
another and is replaced after BROWSER_MAX_PAGES of them, which gives back what a long-lived
context gathers (scrapy-playwright's issue 240: 700 pages, 4-5 GB growing to 18 GB). After each
page the browser's memory is read from /proc (renderer/processes.py), at most every
MEMORY_CHECK_EVERY_S; past BROWSER_MAX_RSS_MB the pool waits for the pages in flight, closes
the browser and starts a new one. A browser that crashed or disconnected is started again for the next page.

Every request leaves through the guarded proxy (renderer/proxy.py), and each context routes
requests past a second check, the address guard on the URL as written and http(s) only, with
service workers blocked (their requests are not routed). Websockets have no route; the proxy is
the guard there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from playwright.async_api import Browser, BrowserContext, Page, Playwright, Route, async_playwright
from playwright.async_api import Error as PlaywrightError

from renderer.page import Extras, Rendered, open_page, render, translated
from renderer.processes import browser_groups, descendants, group_memory_bytes, kill_group
from renderer.watchdog import Watchdog
from shared.errors import BlockedAddress
from shared.urls import InvalidURL

log = logging.getLogger(__name__)

# The browser's memory is the PSS of each of its processes, which the kernel adds up by walking
# their page tables: about 50 ms of CPU for a browser of 550 MB here, a tenth of a page's whole
# render when it was read after every page. Memory grows over many pages, not within seconds.
MEMORY_CHECK_EVERY_S = 5.0

UrlCheck = Callable[[str], None]  # raises BlockedAddress (or InvalidURL) for a URL not to fetch
Refused = Callable[[str, str], None]


@dataclass(frozen=True)
class BrowserOptions:
    chromium_path: str
    proxy_port: int
    slots: int  # pages in flight
    max_pages_per_context: int
    max_memory_bytes: int
    page_heap_mb: int  # V8's heap cap for a page: a script allocating without end crashes its tab
    route_check: bool = True  # the second layer; off only to test that the proxy holds alone

    def launch_args(self) -> list[str]:
        return [
            "--disable-dev-shm-usage",  # a container's /dev/shm is 64 MB
            f"--proxy-server=http://127.0.0.1:{self.proxy_port}",
            "--proxy-bypass-list=<-loopback>",  # Chromium reaches loopback directly otherwise
            "--disable-quic",
            "--dns-prefetch-disable",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-pings",
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
            "--block-new-web-contents",
            f"--js-flags=--max-old-space-size={self.page_heap_mb}",
        ]


@dataclass
class _Slot:
    context: BrowserContext | None = None
    page: Page | None = None  # reused until it fails or its context is replaced
    generation: int = -1  # of the browser its context belongs to
    pages: int = 0
    extras: Extras = field(default_factory=Extras)


@dataclass
class PoolFigures:
    launches: int = 0
    restarts_for_memory: int = 0
    contexts: int = 0
    popups_closed: int = 0
    routed_refusals: int = 0


class BrowserPool:
    def __init__(
        self, options: BrowserOptions, check_url: UrlCheck, watchdog: Watchdog, refused: Refused
    ) -> None:
        self._options = options
        self._check_url = check_url
        self._watchdog = watchdog
        self._refused = refused
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._browser_group: int | None = None
        self._generation = 0
        self._launching = asyncio.Lock()
        self._restarting = False
        self._memory_checked_at = float("-inf")  # the first page's end checks it
        self._free: asyncio.Queue[_Slot] = asyncio.Queue()
        for _ in range(options.slots):
            self._free.put_nowait(_Slot())
        self.figures = PoolFigures()

    async def render(self, url: str, deadline_s: float) -> Rendered:
        slot = await self._free.get()
        try:
            context = await self._context_of(slot)
            if slot.page is None or slot.page.is_closed():
                slot.page = await open_page(context, slot.extras)
            slot.pages += 1
            rendered = await render(slot.page, url, deadline_s, slot.extras)
            self.figures.popups_closed += rendered.popups_closed
            return rendered
        except PlaywrightError as exc:  # the browser or context went away around the page
            await self._drop_page(slot)
            slot.context = None
            raise translated(exc) from None
        except BaseException:
            await self._drop_page(slot)  # crashed, timed out, refused: its next page is new
            raise
        finally:
            self._free.put_nowait(slot)
            await self._restart_if_over_memory()

    def browser_memory_bytes(self) -> int:
        return group_memory_bytes(self._browser_group) if self._browser_group is not None else 0

    @staticmethod
    async def _drop_page(slot: _Slot) -> None:
        page, slot.page = slot.page, None
        if page is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(page.close(), 5)

    async def warm_up(self) -> None:
        """Starts the browser now, so a CHROMIUM_PATH that cannot run shows at start."""
        await self._running_browser()

    async def close(self) -> None:
        await self._close_browser()
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.stop()
            self._playwright = None

    async def _context_of(self, slot: _Slot) -> BrowserContext:
        browser = await self._running_browser()
        if slot.context is not None and slot.generation == self._generation:
            if slot.pages < self._options.max_pages_per_context:
                return slot.context
            with contextlib.suppress(PlaywrightError):
                await slot.context.close()  # recycled: what it gathered goes with it, its page too
        slot.page = None
        context = await browser.new_context(accept_downloads=False, service_workers="block")
        if self._options.route_check:
            await context.route("**/*", self._second_check)
        slot.context, slot.generation, slot.pages = context, self._generation, 0
        self.figures.contexts += 1
        return context

    async def _second_check(self, route: Route) -> None:
        url = route.request.url
        reason = None
        if not url.startswith(("http://", "https://")):
            reason = "scheme"
        else:
            try:
                self._check_url(url)
            except (BlockedAddress, InvalidURL):
                reason = "blocked_address"
        if reason is None:
            with contextlib.suppress(PlaywrightError):
                await route.continue_()
            return
        self.figures.routed_refusals += 1
        self._refused(reason, url[:200])
        with contextlib.suppress(PlaywrightError):
            await route.abort("blockedbyclient")

    async def _running_browser(self) -> Browser:
        async with self._launching:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            if self._browser is not None:
                log.warning("the browser is gone; starting another")
                await self._close_browser()
            if self._playwright is None:
                self._playwright = await async_playwright().start()
                for driver in descendants(os.getpid()):
                    self._watchdog.watch_process(driver.pid)  # the Playwright driver
            known = set(browser_groups(os.getpid()))
            self._browser = await self._playwright.chromium.launch(
                executable_path=self._options.chromium_path,
                args=self._options.launch_args(),
                chromium_sandbox=False,
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
            )
            started = [group for group in browser_groups(os.getpid()) if group not in known]
            self._browser_group = started[0] if started else None
            for group in started:
                self._watchdog.watch_group(group)
            self._generation += 1
            self.figures.launches += 1
            return self._browser

    async def _restart_if_over_memory(self) -> None:
        now = time.monotonic()
        if self._browser_group is None or now - self._memory_checked_at < MEMORY_CHECK_EVERY_S:
            return
        self._memory_checked_at = now
        if self.browser_memory_bytes() <= self._options.max_memory_bytes:
            return
        if self._restarting:
            return  # another page's check is restarting it
        self._restarting = True
        held: list[_Slot] = []
        try:
            # Every slot taken: the pages in flight finish first, and none starts meanwhile.
            held = [await self._free.get() for _ in range(self._options.slots)]
            if self.browser_memory_bytes() > self._options.max_memory_bytes:
                log.info("browser over %d MB; restarting it", self._options.max_memory_bytes >> 20)
                self.figures.restarts_for_memory += 1
                async with self._launching:
                    await self._close_browser()
        finally:
            for slot in held:
                self._free.put_nowait(slot)
            self._restarting = False

    async def _close_browser(self) -> None:
        browser, group = self._browser, self._browser_group
        self._browser, self._browser_group = None, None
        self._generation += 1  # every slot's context is stale now
        if browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 10)
        if group is not None:
            kill_group(group, signal.SIGKILL)  # what a crashed browser left behind
            self._watchdog.forget_group(group)
