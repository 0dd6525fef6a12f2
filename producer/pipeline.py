"""The producer's loop: URLs in, confirmed tasks out, free of transport details.

    entries → canonicalize (invalid: counted by reason) → groups → dedup claim (one Redis
    call) → route → publish in batches (confirms pipelined) → confirmed: mark seen + count
                                                            → failed: retry, then un-mark + count

Several batches are in flight at once, so reading and claiming the next group overlaps with
the broker confirming the previous batches. Dedup calls run on threads of their own
(producer/background.py): a group is claimed while the next one is read, and confirmed URLs
are marked seen while the loop goes on; only publishing waits for a claim. Dedup, the publisher
and the clock are injected (their shapes, and the counts a run gives back, are in
producer/pipeline_types.py).

When RabbitMQ or Redis goes away (a restart, a lost connection), nothing is given up at once:
each call that needs them is tried again with a growing pause for up to `patience_s`, and
batches that were not confirmed are published again on the new connection. Only a refusal by
the broker (a nack, an unroutable message) uses up one of the PUBLISH_ATTEMPTS, a growing pause
apart: a cluster without a majority nacks until it has one again. A stop request
(`should_stop`) ends reading between two URLs; what is in flight is still settled.

A claim can also be taken over from a producer that died (published again, counted as
`republished`), or be held by one that is alive: such URLs are asked for again once the input
is read, until that producer has confirmed them (duplicates), released them, or died.
"""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt, wait_exponential

from producer.background import Background
from producer.pipeline_types import ClaimResult, Counts, DedupStore, Outcomes, PreviousFetches, Publisher
from producer.recrawl import is_due
from producer.routing import Router
from producer.sitemaps import SitemapEntry
from shared import metrics, retrying
from shared.broker import Publication
from shared.errors import ServiceUnavailable
from shared.messages import QUEUE_KINDS, TaskBodies
from shared.topology import new_task_routing_key, work_exchange
from shared.urls import InvalidURL, canonicalize, fingerprint

log = logging.getLogger(__name__)

T = TypeVar("T")

# The first try and seven retries, the pause doubling from RETRY_PAUSE_S up to
# MAX_RECONNECT_PAUSE_S: about a minute. A quorum queue that has lost its majority (two nodes of
# three down) nacks every publish until a majority is back, which takes a node's restart; three
# attempts a second apart ran out within 4 s (docs/SCALING.md, "RabbitMQ cluster").
PUBLISH_ATTEMPTS = 8
RETRY_PAUSE_S = 1.0
# How long to wait for an unreachable RabbitMQ or Redis before giving up. The claims stay ours
# meanwhile as long as the heartbeat reaches Redis (producer/liveness.py).
RECONNECT_PATIENCE_S = 240.0
MAX_RECONNECT_PAUSE_S = retrying.MAX_PAUSE_S
BATCHES_IN_FLIGHT = 8
# URLs claimed, and later marked seen, in one Redis call, however small the publish batches:
# each call costs the thread making it two turns at the interpreter lock, up to 5 ms each while
# the loop is busy, and calls for batches of 500 fell behind the loop.
DEDUP_GROUP_URLS = 2000
# ...unless the URLs come slowly (a slow sitemap server): then a group is claimed and published
# at the first whole batch read after it has been filling this long.
MAX_GROUP_HOLD_S = 0.5
# Groups claimed ahead of the one published: its claim ran while the next group was read.
CLAIMS_AHEAD = 1
PROGRESS_EVERY_URLS = 10_000
# Between two asks for URLs another producer, alive, has claimed: a fraction of its heartbeat's
# TTL, so a dead one's claims are taken over soon after it is known dead.
BUSY_RECHECK_S = 1.0


@dataclass(slots=True)  # not frozen: made for every URL, and frozen dataclasses build slowly
class _Candidate:
    entry: SitemapEntry
    canonical: str
    fingerprint: bytes


@dataclass
class _Claiming:
    """A group of URLs read, whose claim runs in the background while the next group is read."""

    candidates: list[_Candidate]
    claim: concurrent.futures.Future[ClaimResult]


@dataclass
class _InFlight:
    fingerprints: list[bytes]
    queues: list[str]  # the kind of queue each URL went to
    publications: list[Publication]
    token: bytes
    outcomes: Outcomes
    duplicates: int
    invalid: int
    taken: list[bool]  # whether each URL's claim was taken over from a dead producer


class Pipeline:
    def __init__(
        self,
        run_id: str,
        namespace: str,
        batch_size: int,
        router: Router,
        dedup: DedupStore,
        publisher: Publisher,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,  # its return value is ignored
        should_stop: Callable[[], bool] = lambda: False,
        patience_s: float = RECONNECT_PATIENCE_S,
        previous_run: PreviousFetches | None = None,
    ) -> None:
        self.run_id = run_id
        self.counts = Counts()
        self._batch_size = batch_size
        self._router = router
        self._dedup = dedup
        self._publisher = publisher
        self._clock = clock
        self._sleep = sleep
        self._should_stop = should_stop
        self._patience_s = patience_s
        self._previous_run = previous_run
        self._gave_up = False  # patience ran out once: later calls fail at once
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        # One run per pipeline: run() ends their threads. Claims have a thread of their own so
        # that they never wait behind marks, which nothing waits for.
        self._claims = Background("producer-claims")
        self._marks = Background("producer-marks")
        # Read and claimed, or being claimed, not yet published; oldest first.
        self._claiming: collections.deque[_Claiming] = collections.deque()
        self._busy: list[_Candidate] = []  # claimed by another producer, alive: to ask again
        self._unmarked: list[bytes] = []  # confirmed, to be marked seen with the next group
        self._unmarked_counters: collections.Counter[str] = collections.Counter()
        self._marked_at = clock()  # when confirmed URLs were last marked seen
        self._invalid_unreported = 0
        # The same for every task: made once, not per URL.
        self._exchange = work_exchange(namespace)
        self._routing_keys = {kind: new_task_routing_key(kind) for kind in QUEUE_KINDS}

    def run(self, entries: Iterable[SitemapEntry]) -> Counts:
        group: list[_Candidate] = []
        began = self._clock()
        try:
            for entry in entries:
                if self._should_stop():
                    self.counts.stopped_early = True
                    log.warning("stop requested: no more URLs read; settling what is in flight")
                    break
                self._take(entry, group)
                if group and len(group) % self._batch_size == 0:  # looked at a batch at a time
                    slow = self._clock() - began >= MAX_GROUP_HOLD_S
                    if slow or len(group) >= DEDUP_GROUP_URLS:
                        self._claim(group)
                        group, began = [], self._clock()
                        self._send_claimed(ahead=0 if slow else CLAIMS_AHEAD)
            self._claim(group)
            self._send_claimed(ahead=0)
            self._claim_busy_again()
        finally:
            # Even when something broke, settle what is in flight: confirmed URLs get marked,
            # failed ones un-marked, so the run can be resumed with the same run id.
            try:
                while self._claiming:
                    self._give_back(self._claiming.popleft())
                while self._in_flight:
                    self._complete(self._in_flight.popleft())
                self._mark_seen()
                self._marks.finish()
            finally:
                self._claims.close()
                self._marks.close()
        if self._invalid_unreported:
            self._dedup.confirm([], {"invalid": self._invalid_unreported})
        self._log_progress("done")
        return self.counts

    def _take(self, entry: SitemapEntry, group: list[_Candidate]) -> None:
        self.counts.urls_seen += 1
        if self.counts.urls_seen % PROGRESS_EVERY_URLS == 0:
            self._log_progress("progress")
        try:
            canonical = canonicalize(entry.url)
        except InvalidURL as exc:
            self.counts.invalid[str(exc)] += 1
            metrics.URLS_INVALID.labels(str(exc)).inc()  # reasons are a short list (shared/urls.py)
            self._invalid_unreported += 1
            log.debug("invalid URL from %s: %s", entry.source, exc)
            return
        group.append(_Candidate(entry, canonical, fingerprint(canonical)))

    def _claim(self, group: list[_Candidate], again: bool = False) -> None:
        """Start claiming `group` in the background (`again`: URLs found busy before)."""
        if group and self._previous_run is not None and not again:
            group = self._due_again(group, self._previous_run)
        if group:
            fingerprints = [c.fingerprint for c in group]
            claim = functools.partial(
                self._patiently, "claiming URLs", lambda: self._dedup.claim(fingerprints)
            )
            self._claiming.append(_Claiming(group, self._claims.call(claim)))

    def _claim_busy_again(self) -> None:
        """Ask again for the URLs another producer held while it was alive, until each is settled:
        confirmed by it (a duplicate), released by it, or taken over once it is dead."""
        if self._busy:  # what was published is settled and marked before any wait
            while self._in_flight:
                self._complete(self._in_flight.popleft())
            self._mark_seen()
        while self._busy:
            if self._should_stop():
                self.counts.left_claimed = len(self._busy)
                log.warning("stopping with %d URLs still claimed by another producer", len(self._busy))
                return
            log.info(
                "%d URLs are claimed by another producer, alive: asking again in %.0f s",
                len(self._busy),
                BUSY_RECHECK_S,
            )
            self._sleep(BUSY_RECHECK_S)
            busy, self._busy = self._busy, []
            for start in range(0, len(busy), DEDUP_GROUP_URLS):
                self._claim(busy[start : start + DEDUP_GROUP_URLS], again=True)
                self._send_claimed(ahead=0)

    def _send_claimed(self, ahead: int) -> None:
        """Publish the groups claimed, oldest first, until no more than `ahead` are left."""
        while len(self._claiming) > ahead:
            self._send(self._claiming.popleft())

    def _give_back(self, claiming: _Claiming) -> None:
        """Release the claims of a group that will not be published (the run broke off)."""
        try:
            claim = claiming.claim.result()
            new = [
                c.fingerprint for c, is_new in zip(claiming.candidates, claim.is_new, strict=True) if is_new
            ]
            self._release_now(new, claim.token)
        except ServiceUnavailable as exc:  # their leases run out instead; a re-run publishes them
            log.warning(
                "could not release the claims of %d unpublished URLs: %s", len(claiming.candidates), exc
            )

    def _send(self, claiming: _Claiming) -> None:
        """Publish the new URLs of a claimed group, a batch at a time."""
        claim = claiming.claim.result()
        new: list[_Candidate] = []
        taken: list[bool] = []
        busy = 0
        flags = zip(
            claiming.candidates, claim.is_new, _flags(claim, "taken_over"), _flags(claim, "busy"), strict=True
        )
        for candidate, is_new, was_taken, is_busy in flags:
            if is_new:
                new.append(candidate)
                taken.append(was_taken)
            elif is_busy:
                self._busy.append(candidate)
                busy += 1
        duplicates = len(claiming.candidates) - len(new) - busy
        taken_over = taken.count(True)
        self.counts.taken_over += taken_over
        if taken_over:
            log.info("took over %d claims of a producer that is gone: publishing them again", taken_over)
        sent = 0
        try:
            # At least one batch, if empty, so that the group's counts are recorded.
            for start in range(0, max(len(new), 1), self._batch_size):
                batch = new[start : start + self._batch_size]
                group_counts = duplicates if start == 0 else 0
                self._submit(batch, claim.token, group_counts, taken[start : start + self._batch_size])
                sent = start + len(batch)
                while len(self._in_flight) >= BATCHES_IN_FLIGHT:
                    self._complete(self._in_flight.popleft())
                self._complete_confirmed()
                self._marks.check()  # a failed mark ends the run here rather than at its end
        finally:
            if sent < len(new):  # the run broke off: what was not sent is given back
                self._release_now([c.fingerprint for c in new[sent:]], claim.token)

    def _complete_confirmed(self) -> None:
        """Settle the batches whose confirms are all in, oldest first, without waiting: their
        URLs are marked seen soon, not only once more batches push them out, so a kill -9
        leaves few confirmed URLs unmarked (each such URL is published again by the next run)."""
        while self._in_flight and getattr(self._in_flight[0].outcomes, "done", lambda: False)():
            self._complete(self._in_flight.popleft())

    def _release_now(self, fingerprints: list[bytes], token: bytes) -> None:
        """Give claims back, in order behind the marks already queued, and wait for it."""
        self._marks.call(lambda: self._dedup.release(fingerprints, token)).result()

    def _submit(self, batch: list[_Candidate], token: bytes, duplicates: int, taken: list[bool]) -> None:
        now = self._clock()
        recrawl_of = self._previous_run.run_id if self._previous_run is not None else None
        bodies = TaskBodies(self.run_id, now, recrawl_of)
        queues = []
        publications = []
        for candidate in batch:
            queue, publication = self._publication(candidate, bodies, now)
            queues.append(queue)
            publications.append(publication)
        outcomes = self._patiently("publishing", lambda: self._publisher.submit(publications))
        self._in_flight.append(
            _InFlight(
                fingerprints=[c.fingerprint for c in batch],
                queues=queues,
                publications=publications,
                token=token,
                outcomes=outcomes,
                duplicates=duplicates,
                invalid=self._invalid_unreported,
                taken=taken,
            )
        )
        self._invalid_unreported = 0

    def _due_again(self, batch: list[_Candidate], previous: PreviousFetches) -> list[_Candidate]:
        fetched = self._patiently(
            "reading the earlier run", lambda: previous.fetched_at([c.canonical for c in batch])
        )
        now = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
        due = [c for c in batch if is_due(c.entry.lastmod, c.entry.changefreq, fetched.get(c.canonical), now)]
        self.counts.not_due += len(batch) - len(due)
        return due

    def _publication(self, candidate: _Candidate, bodies: TaskBodies, now: float) -> tuple[str, Publication]:
        """The queue kind `candidate` is routed to, and its message: the body a CrawlTask of it
        would encode to, made without one (the producer makes one for every URL)."""
        entry = candidate.entry
        route = self._router.route(candidate.canonical, entry.priority, entry.lastmod, now)
        queue = route.queue
        priority = route.message_priority if queue == "priority" else 0
        body = bodies.body(
            candidate.canonical,
            queue,
            priority,
            entry.lastmod,
            entry.changefreq,
            entry.priority,
            entry.source,
        )
        # No progress headers: a message without them is a URL's first attempt
        # (shared/messages.py), and RabbitMQ spends less on a message without a table.
        publication = Publication(
            self._exchange,
            self._routing_keys[queue],
            body,
            priority=priority if queue == "priority" else None,
        )
        return queue, publication

    def _complete(self, item: _InFlight) -> None:
        waiting_since = self._clock()
        failed = [i for i, ok in enumerate(item.outcomes.wait()) if not ok]
        self.counts.unconfirmed += len(failed)
        try:
            for attempt in self._publish_attempts():
                with attempt:
                    if attempt.retry_state.attempt_number > 1:  # the first is the batch's own publish
                        failed = self._publish_again(item, failed)
                outcome = attempt.retry_state.outcome
                if outcome is not None and not outcome.failed:
                    attempt.retry_state.set_result(failed)  # what decides whether to try again
        except ServiceUnavailable as exc:
            log.error("cannot retry publishes: %s", exc)
        waited_s = self._clock() - waiting_since
        self.counts.confirm_wait_max_s = max(self.counts.confirm_wait_max_s, waited_s)
        self._settle(item, set(failed))

    def _publish_again(self, item: _InFlight, failed: list[int]) -> list[int]:
        """Publish the batch's `failed` publications again; returns those still not confirmed."""
        again = [item.publications[i] for i in failed]
        retried = self._patiently("re-publishing", functools.partial(self._publisher.publish_batch, again))
        return [i for i, ok in zip(failed, retried, strict=True) if not ok]

    def _publish_attempts(self) -> Retrying:
        """Up to PUBLISH_ATTEMPTS tries, the pause doubling from RETRY_PAUSE_S, while some
        publishes of a batch are not confirmed (each try's result: the indexes of those); then the
        rest are given up."""

        def before_retry(state: RetryCallState) -> None:
            assert state.outcome is not None
            unconfirmed = len(state.outcome.result())
            next_attempt = state.attempt_number + 1
            log.warning(
                "%d publishes not confirmed: attempt %d of %d", unconfirmed, next_attempt, PUBLISH_ATTEMPTS
            )

        return Retrying(
            retry=retry_if_result(bool),
            stop=stop_after_attempt(PUBLISH_ATTEMPTS),
            wait=wait_exponential(multiplier=RETRY_PAUSE_S, max=MAX_RECONNECT_PAUSE_S),
            sleep=retrying.sleeping_with(self._sleep),
            before_sleep=before_retry,
            retry_error_callback=lambda _state: None,  # what is still unconfirmed is settled as failed
        )

    def _settle(self, item: _InFlight, failed: set[int]) -> None:
        confirmed = [i for i in range(len(item.queues)) if i not in failed]
        added = dict.fromkeys(QUEUE_KINDS, 0)
        for i in confirmed:
            added[item.queues[i]] += 1
        republished = sum(1 for i in confirmed if item.taken[i])
        counters = {f"enqueued.{kind}": n for kind, n in added.items()}
        # taken_over is counted in Redis by the claim itself (producer/dedup.py).
        counters.update(duplicates=item.duplicates, invalid=item.invalid, republished=republished)
        self._unmarked += [item.fingerprints[i] for i in confirmed]
        self._unmarked_counters.update(counters)
        # Marked a group at a time, or sooner when URLs come slowly: a URL confirmed but not
        # marked is what a kill -9 leaves to be published again.
        if len(self._unmarked) >= DEDUP_GROUP_URLS or self._clock() - self._marked_at >= MAX_GROUP_HOLD_S:
            self._mark_seen()
        if failed:
            failed_fps = [item.fingerprints[i] for i in sorted(failed)]
            self._marks.call_unwatched(
                lambda: self._patiently(
                    "un-marking URLs", lambda: self._dedup.release(failed_fps, item.token)
                )
            )
            self.counts.publish_failed += len(failed)
            log.error(
                "gave up on %d URLs after %d publish attempts (un-marked, a re-run with "
                "run id %s will try them again)",
                len(failed),
                PUBLISH_ATTEMPTS,
                self.run_id,
            )
        for kind, n in added.items():
            self.counts.enqueued[kind] += n
            if n:
                metrics.URLS_ENQUEUED.labels(kind).inc(n)
        self.counts.duplicates += item.duplicates
        self.counts.republished += republished
        metrics.URL_DUPLICATES.inc(item.duplicates)

    def _mark_seen(self) -> None:
        """Mark the URLs confirmed since the last time seen for good, and add up their counts.
        Marks need not hold up the loop: they run in the background, in order, and an error among
        them still ends the run, at the next batch sent or once all is settled."""
        self._marked_at = self._clock()
        fingerprints, self._unmarked = self._unmarked, []
        counters, self._unmarked_counters = dict(self._unmarked_counters), collections.Counter()
        if fingerprints or any(counters.values()):
            self._marks.call_unwatched(
                lambda: self._patiently(
                    "marking URLs seen", lambda: self._dedup.confirm(fingerprints, counters)
                )
            )

    def _patiently(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, tried again with a growing pause while RabbitMQ or Redis is unreachable.
        Raises its ServiceUnavailable once patience runs out, or at once after a stop request."""
        next_pause_too_late = retrying.stop_before(self._clock() + self._patience_s, self._clock)

        def give_up(state: RetryCallState) -> bool:
            if self._gave_up or self._should_stop() or next_pause_too_late(state):
                self._gave_up = True  # later calls fail at once
            return self._gave_up

        def on_pause(error: BaseException, pause_s: float) -> None:
            log.warning("%s: %s; trying again in %.0f s", what, error, pause_s)

        return retrying.patiently(ServiceUnavailable, give_up, self._sleep, on_pause)(call)

    def _log_progress(self, what: str) -> None:
        counts = self.counts
        log.info(
            "%s: %d URLs read, %d enqueued (%d of them re-published after taking over %d claims "
            "of a dead producer), %d duplicates, %d invalid, %d failed",
            what,
            counts.urls_seen,
            counts.enqueued_total,
            counts.republished,
            counts.taken_over,
            counts.duplicates,
            sum(counts.invalid.values()),
            counts.publish_failed,
        )


def _flags(claim: ClaimResult, name: str) -> list[bool]:
    """A claim's per-URL `taken_over` or `busy` flags (producer.dedup.Claim); all False from a
    dedup store that has no other producers to reckon with."""
    flags: Sequence[bool] | None = getattr(claim, name, None)
    return list(flags) if flags is not None else [False] * len(claim.is_new)
