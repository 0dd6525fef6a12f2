"""Whether a delivery's URL is still to be fetched: another copy stored or skipped it already
(the marks of worker/handling/handled.py), or its run is paused or cancelled (shared/redis/runstate.py). The
reads these checks need, and the URL's response-cache entry, go ahead to ride with the first
Redis command the handling sends; a URL back from a hold with its slot is checked in the round
trip that clears its send, and SettledMeanwhile stops it there. worker/handler.py runs the
checks and gives a URL they stop its outcome.
"""

from __future__ import annotations

from shared.consumer import Delivery
from shared.errors import PipelineError
from shared.messages import CrawlTask, Progress
from worker.handling.handled import delivery_kind
from worker.handling.log import log, log_context
from worker.handling.ports import Cache, Handled, RunStates
from worker.handling.waits import Waiting, back_with_its_slot


def read_ahead(cache: Cache, run_states: RunStates | None, delivery: Delivery, task: CrawlTask) -> None:
    """A URL's cache read, and its run's state when the worker's copy is stale, go with the
    "already handled?" check, in one round trip. A URL back from a hold reads the cache
    again, if at all, when it comes to that; the run's state it reads again, as it does on
    arrival: at 2 pages a second a worker's copy is stale most of the time."""
    if not isinstance(delivery.memo, Waiting):
        cache.read_ahead(task.url)
    if run_states is not None:
        run_states.read_ahead(task.run_id)


def checks_ride_with_the_send(delivery: Delivery, progress: Progress) -> bool:
    """Whether this delivery's checks (another copy settled? the run paused or cancelled?)
    wait for the Redis command that clears its send. A URL back from a hold with its slot
    was checked when it came; checked again before it is fetched, but in the clearance's
    round trip, not one of its own: that was one of two round trips a held page made on
    its way back, in a polite crawl's every page. The slot is spent if the answer is no."""
    memo = delivery.memo
    return not progress.replays and back_with_its_slot(memo)


def already_handled(handled: Handled | None, delivery: Delivery, task: CrawlTask, progress: Progress) -> bool:
    if handled is None or progress.replays:
        return False
    kind = delivery_kind(delivery.headers, delivery.redelivered)
    back_from_hold = isinstance(delivery.memo, Waiting)  # counted when it first came
    if not handled.already_handled(task, kind, from_producer=not delivery.headers, counted=back_from_hold):
        return False
    log.info("already handled %s run=%s: acked, not fetched", task.url, task.run_id, extra=log_context(task))
    return True


class SettledMeanwhile(PipelineError):
    """A URL whose checks were due with its send found settled by another copy (`handled`),
    or its run paused or cancelled: not fetched (see checks_ride_with_the_send)."""

    def __init__(self, handled: bool) -> None:
        super().__init__("handled" if handled else "run paused or cancelled")
        self.handled = handled
