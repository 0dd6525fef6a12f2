"""What a worker does with one delivery: `CrawlHandler.__call__(delivery) -> Outcome`.

Free of pika: it returns what to publish and whether to ack, and the shared consumer loop does
it. The order of work for a URL: decode → robots.txt (skip if disallowed) → response cache
(fresh: done; stale: revalidate) → domain gate (rate, concurrency, pause) → fetch → parse →
commit → (ack). Transient failures go to a retry queue with the attempt count in our own
header; the last allowed failure, or a permanent one, goes to the dead-letter exchange. A URL
the domain cannot take now (TryLater) is held unacked in the worker until it can (its slot
reserved, when the gate could), or for a wait beyond MAX_HOLD_S goes to a defer queue, apart
from the retries; either way without being charged an attempt: never dropped, never acked
unprocessed.

Here is the story of one URL, its delivery in hand as a `Handling` passed from step to step
(no per-thread state). The handler holds its parts: the holds of URLs waiting here for their
domains' slots (`holds`, worker/handling/waits.py) and the hand-over of rows to the store
(`rows`, worker/handling/storing.py). It uses the checks of a URL already settled
(worker/handling/settled.py) and the copies forwarded to a retry, defer, hold or render queue
or the dead-letter exchange (worker/handling/forwards.py); the shapes of what it is handed are
in worker/handling/ports.py. Each step ends in a value of worker/handling/endings.py, and one
method, `decide`, turns it into the outcome and the ack: a stored page's twice, as its row goes
to the writer and when its message comes back with the writer's report (on the connection's
thread, so that decision never waits: docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from shared import metrics
from shared.amqp.topology import Topology
from shared.consumer import Delivery, Outcome
from shared.errors import (
    BlockedAddress,
    DecodeError,
    PermanentError,
    ServiceUnavailable,
    TransientError,
    UnstorableRow,
)
from shared.message_bounds import RENDER_KIND
from shared.messages import CrawlTask, Progress
from shared.redis.runstate import CANCELLED, PAUSED
from shared.settings import Settings
from shared.try_later import TryLater
from shared.urls import domain_of
from worker.fetch.response import Response
from worker.handling.discovered_links import after_storing
from worker.handling.endings import Ending, Failed, Passed, RowHandedIn, Skipped, Stored, Written
from worker.handling.forwards import dead_letter, defer, hold_paused, retry, to_render
from worker.handling.log import log
from worker.handling.ports import (
    Archive,
    Cache,
    DeliveryLimit,
    Fetch,
    Gate,
    Handled,
    Robots,
    RunStates,
    Store,
)
from worker.handling.settled import SettledMeanwhile, already_handled, checks_ride_with_the_send, read_ahead
from worker.handling.storing import StoredRows, page_row, profile_fields
from worker.handling.waits import WAIT_REASONS, Parked, SlotHolds, Waiting, back_with_its_slot
from worker.parse.page import decode_html, parse_budget, parse_page
from worker.parse.profiles import Profiles
from worker.parse.script_shell import SCRIPT_SHELL, looks_like_script_shell
from worker.politeness.robots import RobotsAnswer, RobotsRules

SKIP_REASONS = ("robots", "blocked_address", "cancelled")  # every reason a Skipped ending is given

T = TypeVar("T")


@dataclass
class Handling:
    """One delivery in the hands of a handler thread: its message, and what its handling has
    done so far. Made by CrawlHandler.__call__ and passed down the story, never kept."""

    delivery: Delivery
    marked: bool = False  # its "handling" marker is in Redis, or rides with the next command
    cache_missed: bool = False  # the response cache had nothing for its URL
    # Its checks (another copy settled? the run paused or cancelled?), when they ride with the
    # send's clearance (worker/handling/settled.py); None once run, or when run on arrival.
    checks_due: tuple[CrawlTask, Progress] | None = None


@dataclass
class CrawlHandler:
    settings: Settings
    topology: Topology
    fetch: Fetch  # shared by the handler threads
    cache: Cache
    gate: Gate
    robots: Robots
    store: Store
    clock: Callable[[], float] = time.time
    delivery_limit: DeliveryLimit | None = None  # bounds redeliveries of a crash-looping message
    profiles: Profiles = dataclasses.field(default_factory=Profiles)
    handled: Handled | None = None  # skips a second copy of a URL already settled
    run_states: RunStates | None = None  # paused and cancelled runs (shared/redis/runstate.py)
    sent_to_render: Callable[[str, str], None] | None = None  # (run id, reason): the run's figure
    archive: Archive | None = None  # WARC records of every stored page (worker/warc/), if WARC_DIR

    def __post_init__(self) -> None:
        # Each skip reason's series exists from the start, at 0: a series born at its first
        # skip has no earlier sample, so Prometheus's increase() and rate() miss that skip, and
        # all of them when the worker stops before its next scrape.
        for reason in SKIP_REASONS:
            metrics.SKIPS.labels(reason)
        for reason in WAIT_REASONS:  # a crawl whose waits are all held in-process defers none
            metrics.HOLDS.labels(reason)
            metrics.DEFERRALS.labels(reason)
        metrics.HOLDS.labels("parked")  # waits here before its handling (parked())
        # Parsing is pure Python under the GIL: however many threads parse at once, one runs.
        # Letting them all start only multiplies half-built trees in memory and forced thread
        # switches; one parse at a time took a worker with 32 fetches in flight from a 79 MB
        # to a 69 MB peak, with less CPU per page. A plain lock, not a Semaphore: that one is
        # Python code around a Condition, and its wake-ups showed up in the profile.
        self._parse_lock = threading.Lock()
        # Bounds how long one page holds that lock, and what it costs (docs/SECURITY.md).
        self._parse_budget = parse_budget(self.settings)
        # Its parts: the URLs held here for their domains' slots, and the rows handed to the store.
        self.holds = SlotHolds(self.settings)
        self.rows = StoredRows(self.store)
        self._render_shells = self.settings.render == "auto"  # worker/parse/script_shell.py

    def parked(self, delivery: Delivery) -> Outcome | None:
        """On the connection's thread, as a message comes: a hold for a URL whose domain's slot
        is held here already (SlotHolds.parked); None for any other."""
        return self.holds.parked(delivery)

    def __call__(self, delivery: Delivery) -> Outcome:
        if isinstance(delivery.memo, RowHandedIn):  # back with the writer's report on its page's row
            return self.decide(Handling(delivery), delivery.memo.written())
        if self.delivery_limit is not None and (too_often := self.delivery_limit.check(delivery)):
            return self.decide(Handling(delivery), Passed(too_often))  # dead-lettered as poison
        handling = Handling(delivery)
        try:
            return self.decide(handling, self._handle(handling))
        finally:
            self.cache.drop_read_ahead()  # a read ahead is good for one handling
            if self.run_states is not None:
                self.run_states.drop_read_ahead()
            if handling.marked and self.delivery_limit is not None:
                # Left behind, the marker only expires; the outcome matters more.
                with contextlib.suppress(ServiceUnavailable):
                    self.delivery_limit.unmark_handling(delivery)

    def decide(self, handling: Handling, ending: Ending) -> Outcome:  # noqa: C901 (one case an ending, on purpose)
        """The one place a URL's outcome and its ack are decided, from what became of it: every
        step of the story below ends in one of the endings of worker/handling/endings.py, and
        a stored page's message comes back here with the writer's report on its row."""
        body = handling.delivery.body
        worker_id = self.settings.worker_id
        match ending:
            case Stored(row=row):
                # Done but for the commit: this thread takes its next message meanwhile, and the
                # writer batches the row with others; the message comes back as Written.
                report = self.rows.hand_in(row)
                return Outcome.back_when(report, RowHandedIn(ending, report))
            case Written(stored=stored, error=None):
                # Not marked while its links are still to be confirmed: a mark that landed first
                # would make a redelivery after a crash skip the page, and its links with it. A
                # second copy is then fetched and stored again (one row all the same).
                links = stored.links
                mark = links is None or not links.publications
                self.rows.note_stored(stored.task, stored.response, stored.progress, self.handled, mark)
                return links or Outcome.done()  # acked once the links, if any, are confirmed
            case Written(stored=stored, error=UnstorableRow() as refused):
                task, progress = stored.task, stored.progress
                return dead_letter(self.topology, worker_id, body, task.queue, progress, refused, task.url)
            case Written(stored=stored, error=ServiceUnavailable() as down):
                # PostgreSQL stayed away past the writer's patience: not the URL's failure.
                log.warning("cannot store %s (%s); its message goes back to its queue", stored.task.url, down)
                return Outcome.reject(requeue=True)
            case Written(stored=stored, error=error):
                # Neither the data's fault nor an outage: our bug. Dead-letter it, not crash-loop.
                log.error("storing %s failed; dead-lettering its message", stored.task.url, exc_info=error)
                return Outcome.reject(requeue=False)
            case Skipped(task=task, progress=progress, reason=reason, detail=detail):
                try:
                    self.rows.write_skip(task, reason, detail, worker_id)
                except UnstorableRow as refused:
                    origin = task.queue
                    return dead_letter(self.topology, worker_id, body, origin, progress, refused, task.url)
                self.rows.note_skipped(task, reason, detail, self.handled)
                return Outcome.done()
            case Failed(task=task, progress=progress, error=error, queue=queue):
                attempts_left = progress.attempt < self.settings.max_attempts
                if task is not None and isinstance(error, TransientError) and attempts_left:
                    return retry(self.topology, self.settings, body, task, progress, error)
                url = task.url if task is not None else ""
                return dead_letter(self.topology, worker_id, body, queue, progress, error, url)
            case Passed(outcome=outcome):
                return outcome
        raise AssertionError(f"no decision for {ending!r}")  # every Ending has its case above

    def _handle(self, handling: Handling) -> Ending:
        delivery = handling.delivery
        try:
            progress = Progress.from_headers(delivery.headers, strict=True)
            task = CrawlTask.decode(delivery.body)
        except DecodeError as exc:
            log.warning("%s message on %s: %s", exc.reason, delivery.queue, exc.detail)
            # Counts that were in range are kept; a bad one reads as absent.
            return Failed(None, Progress.from_headers(delivery.headers), exc, delivery.queue)
        read_ahead(self.cache, self.run_states, delivery, task)
        if self.handled is not None and checks_ride_with_the_send(delivery, progress):
            self.handled.read_ahead(task)  # its mark, to go with the clearance
            handling.checks_due = (task, progress)
        elif (settled := self._settled(handling, task, progress)) is not None:
            return settled
        try:
            return self._crawled(handling, task, progress)
        except SettledMeanwhile as meanwhile:
            if meanwhile.handled:
                return Passed(Outcome.done())
            return self._by_run_state(handling, task, progress) or Passed(Outcome.done())

    def _settled(self, handling: Handling, task: CrawlTask, progress: Progress) -> Ending | None:
        """The outcome of a URL another copy settled, or of a paused or cancelled run's; None
        for a URL to fetch."""
        # Before the run's state: every delivery is counted by kind, once (worker/handling/handled.py),
        # and a second copy of a URL already stored or skipped keeps that one outcome, held
        # or cancelled alike (a `cancelled` skip on top would count the URL twice).
        if already_handled(self.handled, handling.delivery, task, progress):
            return Passed(Outcome.done())
        return self._by_run_state(handling, task, progress)

    def _crawled(self, handling: Handling, task: CrawlTask, progress: Progress) -> Ending:
        delivery = handling.delivery
        try:
            with metrics.FETCHES_IN_FLIGHT.track_inprogress():
                return self._crawl(handling, task, progress)
        except BlockedAddress as exc:
            # Not the URL's failure and nothing to retry: the address is not ours to fetch.
            self._stop_if_settled_meanwhile(handling)  # (robots.txt's fetch can meet it before the check)
            return Skipped(task, progress, "blocked_address", exc.detail)
        except TryLater as later:
            waiting = delivery.memo
            if not isinstance(waiting, Waiting):  # its first wait; a parked URL's began when it came
                waiting = Waiting(waiting.since if isinstance(waiting, Parked) else time.monotonic())
            # Held in all for at most twice MAX_HOLD_S, parked time included: far below the
            # broker's consumer_timeout, whatever the number of URLs waiting for the domain.
            held_s = time.monotonic() - waiting.since + later.wait_s
            if later.wait_s <= self.settings.max_hold_s and held_s <= 2 * self.settings.max_hold_s:
                return Passed(self.holds.wait_here(task, later, waiting, handling.cache_missed))
            return Passed(defer(self.topology, delivery.body, task, progress, later))
        except TransientError as exc:
            self._stop_if_settled_meanwhile(handling)  # a URL settled elsewhere is not retried
            return Failed(task, progress.failed_once_more(self.clock()), exc, task.queue)
        except PermanentError as exc:
            self._stop_if_settled_meanwhile(handling)  # nor dead-lettered
            return Failed(task, progress.failed_once_more(self.clock()), exc, task.queue)

    def _stop_if_settled_meanwhile(self, handling: Handling) -> None:
        """Raises SettledMeanwhile when the checks still due stop the URL; answered from the
        replies read ahead when a command has carried them, else at the cost of a round trip."""
        due = handling.checks_due
        if due is None:
            return
        handling.checks_due = None
        task, progress = due
        if already_handled(self.handled, handling.delivery, task, progress):
            raise SettledMeanwhile(handled=True)
        if self.run_states is not None and self.run_states.state(task.run_id) in (PAUSED, CANCELLED):
            raise SettledMeanwhile(handled=False)

    def _by_run_state(self, handling: Handling, task: CrawlTask, progress: Progress) -> Ending | None:
        """The outcome of a task of a paused or cancelled run; None for a run that goes on."""
        if self.run_states is None:
            return None
        state = self.run_states.state(task.run_id)
        if state == PAUSED:
            return Passed(hold_paused(self.topology, handling.delivery.body, task, progress))
        if state == CANCELLED:
            return Skipped(task, progress, "cancelled", "the run was cancelled by an operator")
        return None

    def _crawl(self, handling: Handling, task: CrawlTask, progress: Progress) -> Ending:
        if not self.holds.will_be_held(handling.delivery.memo, task.url):
            self._mark_handling(handling)  # rides with the gate's round trip, ordinarily
        rules = self._robots_rules(handling, task.url)
        if rules is not None and not rules.allows(task.url):
            self._stop_if_settled_meanwhile(handling)
            return Skipped(task, progress, "robots", "disallowed by robots.txt")
        response = self._response_for(handling, task.url, rules)
        with self._parse_lock:
            html = decode_html(response.body, response.content_type)
            page = parse_page(html, response.final_url, budget=self._parse_budget)
            profile, extracted = profile_fields(self.profiles, task.url, html, self._parse_budget)
        if self._render_shells and task.queue != RENDER_KIND and looks_like_script_shell(html, page.text):
            # RENDER=auto: a page only a browser can build.
            return Passed(to_render(self.topology, task, progress, SCRIPT_SHELL, self.sent_to_render))
        row = page_row(task, response, page, progress, profile, extracted, self.settings.worker_id)
        if self.archive is not None:  # written before the row goes to the store (worker/warc/archive.py)
            at = self.archive.record(response)
            row = dataclasses.replace(
                row, warc_filename=at.filename, warc_offset=at.offset, warc_length=at.length
            )
        # Discovery: the page's links go out with its ack (worker/handling/discovered_links.py).
        return Stored(task, progress, response, row, after_storing(self.topology, task, page, response))

    def _mark_handling(self, handling: Handling) -> None:
        """The "handling" marker (worker/handling/poison.py), once a handling: from here the handling may
        take the worker down, and a redelivery of the message counts."""
        if self.delivery_limit is not None and not handling.marked:
            self.delivery_limit.mark_handling(handling.delivery)
            handling.marked = True

    def _robots_rules(self, handling: Handling, url: str) -> RobotsRules | None:
        if not self.settings.respect_robots:
            return None
        domain = domain_of(url)

        def fetch_robots(robots_url: str) -> RobotsAnswer:
            self._mark_handling(handling)  # robots.txt's answer is parsed next
            return self.gate.call(domain, lambda: self.fetch.robots_txt(robots_url), spaced_from_answer=True)

        return self.robots.rules_for(url, fetch_robots)

    def _response_for(self, handling: Handling, url: str, rules: RobotsRules | None) -> Response:
        """From the cache while fresh; else fetched (conditionally, if cached) through the gate."""
        memo = handling.delivery.memo
        if back_with_its_slot(memo) and memo.cache_missed:
            # Back from a hold with its slot reserved, and the cache had nothing for it when it
            # came: it is fetched now, without reading the cache again (a polite crawl's every
            # page comes this way, and the read was a round trip a page).
            cached = None
        else:
            cached = self.cache.get(url)
            handling.cache_missed = cached is None
        if cached is not None and cached.fresh:
            self._stop_if_settled_meanwhile(handling)
            metrics.CACHE_HITS.inc()
            if self.delivery_limit is not None:
                # The parse is the risk now, and no fetch will send the handling marker first.
                self._mark_handling(handling)
                self.delivery_limit.before_risk()
            return cached.response
        crawl_delay_s = rules.crawl_delay_s if rules is not None else None
        fetched = self.gate.call(
            domain_of(url),
            lambda: self._risky(handling, lambda: self.fetch.page(url, cached)),
            crawl_delay_s,
            may_hold=self.settings.max_hold_s > 0,
            slot=memo.slot if isinstance(memo, Waiting) else None,
        )
        if fetched.not_modified:
            if cached is None:  # the fetcher only asks conditionally with an entry to revalidate
                raise PermanentError("http_304", "not modified, but nothing was cached", 304)
            metrics.NOT_MODIFIED.inc()
            fetched = dataclasses.replace(
                cached.response,
                fetch_ms=fetched.fetch_ms,
                from_cache=True,
                not_modified=True,
                proxy=fetched.proxy,
                exchange=fetched.exchange,  # the 304 as it came, for its revisit record
                etag=fetched.etag or cached.response.etag,
                last_modified=fetched.last_modified or cached.response.last_modified,
            )
        if fetched.status == 200:
            self.cache.put(url, fetched)  # after a 304 too: the entry is fresh again
        return fetched

    def _risky(self, handling: Handling, send: Callable[[], T]) -> T:
        """Makes sure the message's handling marker is in Redis before the part that could kill
        the worker; and that the URL is still to be fetched, when its checks rode with the
        send's clearance."""
        self._stop_if_settled_meanwhile(handling)
        if self.delivery_limit is not None:
            self._mark_handling(handling)  # held already, unless holds.will_be_held guessed wrong
            self.delivery_limit.before_risk()
        return send()
