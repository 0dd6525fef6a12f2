"""What a handled URL leaves in the database: the row of its page (the parsed page's fields and
its extraction profile's), handed to the store with the message acked once the row is
committed, or the row of a URL skipped (disallowed by robots.txt, a blocked address, a
cancelled run). worker/handler.py fetches and parses the page and decides which row a URL
gets; building and handing over the row is here, in StoredRows, which the handler holds.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from typing import Any

from shared import metrics
from shared.amqp.topology import Topology
from shared.consumer import Outcome
from shared.errors import UnstorableRow
from shared.messages import CrawlTask, Progress
from shared.settings import Settings
from worker.fetch.response import Response
from worker.handling.forwards import dead_letter
from worker.handling.log import log, log_context
from worker.handling.ports import Handled, Store
from worker.parse.budget import ParseBudget
from worker.parse.page import ParsedPage
from worker.parse.profiles import Profiles
from worker.parse.soup import new_soup
from worker.store.rows import PageRow, SkipRow


def page_row(
    task: CrawlTask,
    response: Response,
    page: ParsedPage,
    progress: Progress,
    profile: str | None,
    extracted: dict[str, Any],
    worker_id: str,
) -> PageRow:
    return PageRow(
        run_id=task.run_id,
        url=task.url,
        final_url=response.final_url,
        http_status=response.status,
        content_type=response.content_type or "",
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
        worker_id=worker_id,
        not_modified=response.not_modified,
        proxy=response.proxy,
        content_hash=hashlib.blake2b(page.text.encode(), digest_size=16).hexdigest(),
        profile=profile,
        extracted=extracted,
        previous_run=task.recrawl_of,
    )


def profile_fields(
    profiles: Profiles, url: str, html: str, budget: ParseBudget
) -> tuple[str | None, dict[str, Any]]:
    """Fields of the extraction profile for this URL; the page is parsed again only when one
    applies, so crawls without profiles pay nothing."""
    if profiles.for_url(url) is None:
        return None, {}
    try:
        return profiles.extract(url, new_soup(html, budget=budget))
    except Exception as exc:  # hostile markup can break any parser; the page is still stored
        log.warning("extraction profile failed on %s: %s", url, exc)
        return None, {}


class StoredRows:
    """The hand-over of a handled URL's row to the store, held by CrawlHandler: a page's row,
    acked once committed, or a skip's. `handled` is the handler's marks of URLs settled (None:
    none kept), named with each call because the handler's may change."""

    def __init__(self, settings: Settings, topology: Topology, store: Store) -> None:
        self.settings = settings
        self.topology = topology
        self.store = store

    def store_later(
        self,
        body: bytes,
        task: CrawlTask,
        row: PageRow,
        response: Response,
        progress: Progress,
        handled: Handled | None,
        then: Outcome | None = None,
    ) -> Outcome:
        """Hand the row to the store and go on: the message is acked once its row is committed.
        The store keeps the row through a short database outage, so the page is not fetched
        again; past that the message goes back to its queue."""
        settled: concurrent.futures.Future[Outcome] = concurrent.futures.Future()

        def committed(error: BaseException | None) -> None:  # on the store's writer thread
            if isinstance(error, UnstorableRow):  # dead-lettered; acked once that is confirmed
                settled.set_result(
                    dead_letter(
                        self.topology, self.settings.worker_id, body, task.queue, progress, error, task.url
                    )
                )
                return
            if error is not None:
                settled.set_exception(error)
                return
            # Settled first: the row is committed, and a mark or a log line that fails must
            # not leave the message unacked for good.
            settled.set_result(then or Outcome.done())  # `then`: the page's links, in a discovery run
            metrics.PAGES_STORED.labels(task.queue).inc()
            try:
                # Not marked while its links are still to be confirmed: a mark that landed first
                # would make a redelivery after a crash skip the page, and its links with it. A
                # second copy is then fetched and stored again (one row all the same).
                if handled is not None and (then is None or not then.publications):
                    handled.mark_later(task)
                log.info(
                    "stored %s run=%s status=%d cache=%s not_modified=%s attempt=%d",
                    task.url,
                    task.run_id,
                    response.status,
                    response.from_cache,
                    response.not_modified,
                    progress.attempt + 1,
                    extra=log_context(task),
                )
            except Exception as exc:  # a lost mark costs at most one fetch
                log.warning("after storing %s: %s", task.url, exc)

        self.store.save_page_later(row, committed)
        return Outcome.after(settled)

    def skip(
        self,
        body: bytes,
        task: CrawlTask,
        reason: str,
        detail: str,
        progress: Progress,
        handled: Handled | None,
    ) -> Outcome:
        try:
            self.store.save_skip(SkipRow(task.run_id, task.url, reason, detail, self.settings.worker_id))
        except UnstorableRow as exc:
            return dead_letter(
                self.topology,
                self.settings.worker_id,
                body,
                task.queue,
                progress,
                exc,
                task.url,
            )
        if handled is not None:
            handled.mark_later(task)
        metrics.SKIPS.labels(reason).inc()
        log.info("skipped %s run=%s: %s (%s)", task.url, task.run_id, reason, detail, extra=log_context(task))
        return Outcome.done()
