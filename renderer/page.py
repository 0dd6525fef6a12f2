"""One page rendered in a browser context: load, let the scripts run, read the DOM.

The whole render has one deadline (RENDER_DEADLINE_S). The document must load within it, or the
render is a `render_timeout`; after the load, the page is given until the network is idle (no
request for 500 ms) but never past the deadline: a page that never settles (a script polling
for ever) is read as it stands when the deadline comes. A page whose renderer process dies (a
script allocating without end hits the heap cap) is `render_crashed`. A document the guards
refused (renderer/proxy.py), a download, or an answer that is not a page is `render_refused`.
Popups are closed as they open, dialogs dismissed, downloads refused by the context.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from playwright.async_api import BrowserContext, Page, Request, Response
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeout

from renderer.proxy import REFUSED_HEADER
from shared.errors import PermanentError, TransientError
from worker.fetch.verdicts import classify

RENDER_TIMEOUT, RENDER_CRASHED, RENDER_REFUSED = "render_timeout", "render_crashed", "render_refused"
SETTLE_STEP_S = 0.25  # how long the DOM must stay readable after a script navigated the page
BLANK_TIMEOUT_S = 5.0  # leaving a rendered page for about:blank
# Past the deadline, for reading the DOM of a page that never settled: the wait for idle ends at
# the deadline and the read comes after it. With 1 s, a loaded machine (load average 60 on 2
# cores) turned such pages into render_timeouts.
READ_MARGIN_S = 5.0


@dataclass(frozen=True)
class Rendered:
    final_url: str
    status: int
    html: str
    settled: bool  # the network went idle before the deadline
    render_ms: int
    popups_closed: int


class RenderCrashed(TransientError):
    def __init__(self, detail: str) -> None:
        super().__init__(RENDER_CRASHED, detail)


class RenderTimeout(TransientError):
    def __init__(self, detail: str) -> None:
        super().__init__(RENDER_TIMEOUT, detail)


class RenderRefused(PermanentError):
    def __init__(self, detail: str, http_status: int | None = None) -> None:
        super().__init__(RENDER_REFUSED, detail, http_status)


@dataclass
class Extras:
    """What a slot's page closed of its own accord: popups, and the closes still under way."""

    popups_closed: int = 0
    closing: set[asyncio.Future[None]] = field(default_factory=set)  # held until done


async def open_page(context: BrowserContext, extras: Extras) -> Page:
    """A slot's page, reused render after render: a fresh page costs a fresh renderer process,
    about five times the CPU of a page navigated again (0.94 s against 0.2 s a page here).
    Popups it opens (window.open, target=_blank, noopener too) are closed as they appear, its
    dialogs dismissed."""
    page = await context.new_page()

    def close_popup(popup: Page) -> None:
        extras.popups_closed += 1
        closing = asyncio.ensure_future(_quietly(popup.close()))
        extras.closing.add(closing)
        closing.add_done_callback(extras.closing.discard)

    page.on("popup", close_popup)
    page.on("dialog", lambda dialog: asyncio.ensure_future(_quietly(dialog.dismiss())))
    return page


class _Watch:
    """What one render listens for on its page: the renderer process dying, and a document of
    the main frame that the guards refused. Attached for the render, removed after it."""

    def __init__(self, page: Page) -> None:
        self._page = page
        self.crashed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.refused_documents: list[str] = []
        self._listeners: list[tuple[str, Any]] = [
            ("crash", self._note_crash),
            ("response", self._note_refused_document),
            ("requestfailed", self._note_blocked_navigation),
        ]
        for event, listener in self._listeners:
            page.on(event, listener)  # type: ignore[call-overload]

    def remove(self) -> None:
        for event, listener in self._listeners:
            self._page.remove_listener(event, listener)

    def _note_crash(self, _page: Page) -> None:
        if not self.crashed.done():
            self.crashed.set_result(None)

    def _note_refused_document(self, response: Response) -> None:
        # The main frame's documents only: a refused image or XHR leaves the page as it is.
        refused = response.headers.get(REFUSED_HEADER.lower())
        if refused and response.frame == self._page.main_frame and response.request.is_navigation_request():
            self.refused_documents.append(refused)

    def _note_blocked_navigation(self, request: Request) -> None:
        # The route check (renderer/browser.py) aborts a refused navigation before the proxy.
        failure = (request.failure or "").lower()
        main_document = request.is_navigation_request() and request.frame == self._page.main_frame
        if main_document and "blocked_by_client" in failure:
            self.refused_documents.append("blocked_address")


async def render(page: Page, url: str, deadline_s: float, extras: Extras) -> Rendered:
    """Loads `url` in `page` and reads it; then leaves the page on about:blank, so that nothing
    of the document (timers, polling, sockets) runs on. A page that raised is not to be reused."""
    started = time.monotonic()
    popups_before = extras.popups_closed
    watch = _Watch(page)
    try:
        work = asyncio.ensure_future(_load_and_read(page, url, started + deadline_s, watch.refused_documents))
        done, _ = await asyncio.wait(
            (work, watch.crashed), timeout=deadline_s + READ_MARGIN_S, return_when="FIRST_COMPLETED"
        )
        if watch.crashed in done:
            work.cancel()
            raise RenderCrashed("the page's renderer process died")
        if work not in done:
            work.cancel()
            raise RenderTimeout(f"no answer within {deadline_s:g} s")
        final_url, status, html, settled = work.result()
        await asyncio.wait_for(page.goto("about:blank"), BLANK_TIMEOUT_S)
    finally:
        watch.remove()
    return Rendered(
        final_url,
        status,
        html,
        settled,
        int((time.monotonic() - started) * 1000),
        extras.popups_closed - popups_before,
    )


async def _load_and_read(
    page: Page, url: str, deadline: float, refused_documents: list[str]
) -> tuple[str, int, str, bool]:
    try:
        response = await page.goto(url, wait_until="load", timeout=_ms_left(deadline))
    except PlaywrightTimeout:
        raise RenderTimeout(f"{url} did not load within the deadline") from None
    except PlaywrightError as exc:
        raise translated(exc) from None
    if response is None:
        raise RenderRefused("no document was loaded")
    refused = await response.header_value(REFUSED_HEADER)
    if refused:
        raise RenderRefused(f"the document was refused by the guard ({refused})", response.status)
    # The worker's own judgement of the answer: the same http_404, the same Throttled 429 that
    # pauses the domain, the same unsupported_content.
    classify(
        response.status,
        content_type=await response.header_value("content-type"),
        retry_after=await response.header_value("retry-after"),
    )
    settled = True
    try:
        await page.wait_for_load_state("networkidle", timeout=_ms_left(deadline))
    except PlaywrightTimeout:
        settled = False  # read as it stands: the deadline bounds the wait for idle
    except PlaywrightError as exc:
        raise translated(exc) from None
    html = await _read_dom(page, deadline)
    if refused_documents:  # a script or a meta refresh took the page where the guard refused
        raise RenderRefused(f"the page navigated where the guard refused ({refused_documents[-1]})", 403)
    return page.url, response.status, html, settled


async def _read_dom(page: Page, deadline: float) -> str:
    """The DOM as HTML; a script that navigates the page away destroys the document being read,
    so the read waits for the next document's load and tries again until the deadline."""
    while True:
        try:
            return await page.content()
        except PlaywrightError as exc:
            if "crash" in str(exc).lower():
                raise translated(exc) from None
            if _ms_left(deadline) <= 1:
                raise RenderTimeout("the page kept navigating until the deadline") from None
            with contextlib.suppress(PlaywrightError):
                await page.wait_for_load_state("load", timeout=_ms_left(deadline))
            await asyncio.sleep(SETTLE_STEP_S)


def translated(exc: PlaywrightError) -> TransientError | PermanentError:
    text = str(exc).split("\n", 1)[0][:300]
    lowered = text.lower()
    if "crash" in lowered or "target closed" in lowered or "has been closed" in lowered:
        return RenderCrashed(text)
    if "download is starting" in lowered:
        return RenderRefused("the document is a download")
    if "err_tunnel_connection_failed" in lowered or "err_blocked" in lowered:
        return RenderRefused(f"the document was refused by the guard ({text})")
    if "timeout" in lowered or "err_timed_out" in lowered:
        return RenderTimeout(text)
    return TransientError("render_failed", text)


def _ms_left(deadline: float) -> float:
    return max(1.0, (deadline - time.monotonic()) * 1000)


async def _quietly(awaitable: Any) -> None:
    with contextlib.suppress(PlaywrightError, asyncio.CancelledError, Exception):
        await awaitable
