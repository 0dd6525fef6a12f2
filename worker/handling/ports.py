"""The handler's ports: the shapes of the parts a CrawlHandler (worker/handler.py) is handed,
the fetcher, the response cache, the domain gate, robots.txt, the runs' states, the marks of URLs
already handled, the bound on redeliveries and the result store. worker/wiring.py hands it the
real ones and the unit tests hand it fakes; kept apart so that the handler holds the handling
alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from shared.consumer import Delivery, Outcome
from shared.messages import CrawlTask
from shared.try_later import HeldSlot
from worker.fetch.response import CacheEntry, Response
from worker.politeness.robots import RobotsAnswer, RobotsRules
from worker.store.rows import PageRow, SkipRow
from worker.warc.exchange import WarcLocation

T = TypeVar("T")


class Fetch(Protocol):
    def page(self, url: str, revalidate: CacheEntry | None) -> Response:
        """GET `url`; conditional when `revalidate` has validators (then a 304 has no body)."""
        ...

    def robots_txt(self, url: str) -> RobotsAnswer: ...


class Cache(Protocol):
    def get(self, url: str) -> CacheEntry | None: ...

    def read_ahead(self, url: str) -> None:
        """Start reading `url`'s entry, for the get(url) to come on this thread."""
        ...

    def drop_read_ahead(self) -> None: ...

    def put(self, url: str, response: Response) -> bool:
        """Keep `response` for `url` if it is worth keeping; say whether it was kept."""
        ...


class Gate(Protocol):
    """worker.politeness.gate.DomainGate: every request to a domain goes through it."""

    def call(
        self,
        domain: str,
        send: Callable[[], T],
        crawl_delay_s: float | None = None,
        *,
        may_hold: bool = False,
        slot: HeldSlot | None = None,
        spaced_from_answer: bool = False,
    ) -> T: ...


class Robots(Protocol):
    def rules_for(self, url: str, fetch: Callable[[str], RobotsAnswer]) -> RobotsRules: ...


class RunStates(Protocol):
    """shared.redis.runstate.RunStates: running, paused or cancelled, cached for a second."""

    def state(self, run_id: str) -> str: ...

    def read_ahead(self, run_id: str) -> None:
        """Start reading the run's state, if it will be read, for the state(run_id) to come."""
        ...

    def drop_read_ahead(self) -> None: ...


class Handled(Protocol):
    """worker.handling.handled.HandledMarks: URLs of a run already stored or skipped."""

    def already_handled(
        self, task: CrawlTask, kind: str, from_producer: bool, counted: bool = False
    ) -> bool: ...

    def mark_later(self, task: CrawlTask) -> None: ...

    def read_ahead(self, task: CrawlTask) -> None:
        """Have the check of a URL back from a hold (counted=True) read with the next command."""
        ...

    def close(self) -> None: ...


class DeliveryLimit(Protocol):
    """worker.handling.poison.DeliveryLimit: a bound on redeliveries of a message that kills workers."""

    def check(self, delivery: Delivery) -> Outcome | None: ...

    def mark_handling(self, delivery: Delivery) -> None:
        """Leave the "handling" marker, held for the thread's next Redis command."""
        ...

    def before_risk(self) -> None:
        """Make sure the marker is in Redis."""
        ...

    def unmark_handling(self, delivery: Delivery) -> None: ...


class Store(Protocol):
    def save_page_later(self, row: PageRow, committed: Callable[[BaseException | None], None]) -> None: ...

    def save_skip(self, row: SkipRow) -> None: ...


class Archive(Protocol):
    """worker.warc.archive.Archive: the WARC records of every stored page."""

    def record(self, response: Response) -> WarcLocation:
        """Write the page's records; return where its response, revisit or resource record is."""
        ...

    def close(self) -> None:
        """Close the file being written; after the last row is stored."""
        ...
