"""What a handled URL leaves in the database: the row of its page (the parsed page's fields and
its extraction profile's), handed to the writer, which reports once the row is committed, or
the row of a URL skipped (disallowed by robots.txt, a blocked address, a cancelled run).
worker/handler.py fetches and parses the page, decides which row a URL gets and, from the
writer's report, what becomes of its message; building and handing over the rows is here, in
StoredRows, which the handler holds.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from typing import Any

from shared import metrics
from shared.messages import CrawlTask, Progress
from worker.fetch.response import Response
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
    """The hand-over of a handled URL's rows to the store, held by CrawlHandler: a page's row,
    whose commit the writer reports later, and a skip's, written at once; and what is noted of
    each once it is in the database. Which outcome a URL's message gets, the rows' reports
    included, is decided by the handler (CrawlHandler.decide), not here."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def hand_in(self, row: PageRow) -> concurrent.futures.Future[None]:
        """Hand the page's row to the writer and go on: the future is done once the row is
        committed, or fails with what kept it out. The writer keeps the row through a short
        database outage, so the page is not fetched again."""
        report: concurrent.futures.Future[None] = concurrent.futures.Future()

        def committed(error: BaseException | None) -> None:  # on the writer's thread: a report, no more
            if error is None:
                report.set_result(None)
            else:
                report.set_exception(error)

        self.store.save_page_later(row, committed)
        return report

    def write_skip(self, task: CrawlTask, reason: str, detail: str, worker_id: str) -> None:
        """Return once the skip's row is committed (UnstorableRow if PostgreSQL refuses it)."""
        self.store.save_skip(SkipRow(task.run_id, task.url, reason, detail, worker_id))

    @staticmethod
    def note_stored(
        task: CrawlTask, response: Response, progress: Progress, handled: Handled | None, mark: bool
    ) -> None:
        """The page's row is committed: its metric, its mark as handled (`mark`) and its log
        line. Never raises: a lost mark costs at most one fetch, and the message is acked all
        the same."""
        metrics.PAGES_STORED.labels(task.queue).inc()
        try:
            if handled is not None and mark:
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
        except Exception as exc:
            log.warning("after storing %s: %s", task.url, exc)

    @staticmethod
    def note_skipped(task: CrawlTask, reason: str, detail: str, handled: Handled | None) -> None:
        if handled is not None:
            handled.mark_later(task)
        metrics.SKIPS.labels(reason).inc()
        log.info("skipped %s run=%s: %s (%s)", task.url, task.run_id, reason, detail, extra=log_context(task))
