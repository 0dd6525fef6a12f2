"""What became of a URL, as the handler's story ends it: the values CrawlHandler.decide
(worker/handler.py) turns into the delivery's outcome and its ack, the one place that does.

Each step of the story returns one of these instead of an ack of its own. A stored page ends
twice: `Stored` once its row is handed to the writer, `Written` when its message comes back to
the handler (on the connection's thread) with the writer's report on that row (committed, or
the error that kept it out). The writer only reports; what the report means for the message
is decided with the rest.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

from shared.consumer import Outcome
from shared.errors import TaskError
from shared.messages import CrawlTask, Progress
from worker.fetch.response import Response
from worker.store.rows import PageRow


@dataclass(frozen=True)
class Stored:
    """The page is fetched and parsed: its row goes to the writer, and the message is acked
    once the row is committed, after `links` (a discovery run's links, published first)."""

    task: CrawlTask
    progress: Progress
    response: Response
    row: PageRow
    links: Outcome | None = None


@dataclass(frozen=True)
class Written:
    """The writer's report on a Stored page's row: committed when `error` is None."""

    stored: Stored
    error: BaseException | None


@dataclass(frozen=True)
class Skipped:
    """Not to be fetched (robots.txt, a blocked address, a cancelled run): a skip's row."""

    task: CrawlTask
    progress: Progress
    reason: str
    detail: str


@dataclass(frozen=True)
class Failed:
    """The URL failed once more (`progress` counts this failure), or its message is unreadable
    (`task` None, `progress` as it came): retried later while a transient failure has attempts
    left, else dead-lettered."""

    task: CrawlTask | None
    progress: Progress
    error: TaskError
    queue: str  # the queue it came from (a bad message's) or its task's kind


@dataclass(frozen=True)
class Passed:
    """Not this worker's to settle now: held here or deferred until its domain can take it,
    held for its paused run, sent to the renderer, or settled by another copy. `outcome` is
    that hold or that copy, as worker/handling/forwards.py and waits.py build them."""

    outcome: Outcome


Ending = Stored | Written | Skipped | Failed | Passed


@dataclass(frozen=True)
class RowHandedIn:
    """A stored page's message while its row is with the writer (its Delivery.memo): back to the
    handler, on the connection's thread, once `report` is done."""

    stored: Stored
    report: concurrent.futures.Future[None]

    def written(self) -> Written:
        return Written(self.stored, self.report.exception(timeout=0))
