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

When RabbitMQ or Redis goes away, each call that needs them is tried again with a growing
pause for up to `patience_s` (producer/patience.py), and batches that were not confirmed are
published again on the new connection (producer/in_flight.py). A stop request (`should_stop`)
ends reading between two URLs; what is in flight is still settled.

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

from producer.background import Background
from producer.in_flight import BatchesInFlight, PublishedBatch
from producer.patience import RECONNECT_PATIENCE_S, Patience
from producer.pipeline_types import ClaimResult, Counts, DedupStore, PreviousFetches, Publisher
from producer.recrawl import is_due
from producer.routing import Router
from producer.sitemaps import SitemapEntry
from producer.tasks import Candidate, TaskMessages
from shared import metrics
from shared.errors import ServiceUnavailable
from shared.messages import TaskBodies
from shared.urls import InvalidURL, canonicalize, fingerprint

log = logging.getLogger(__name__)

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


class PipelineThreads:
    """The pipeline's two background threads. Claims have a thread of their own so that they
    never wait behind marks, which nothing waits for. A caller that runs many small pipelines
    (the frontier: one a page) lends them the same pair rather than have each start and end
    two threads, which cost it more than its page's Redis reads."""

    def __init__(self) -> None:
        self.claims = Background("producer-claims")
        self.marks = Background("producer-marks")

    def close(self) -> None:
        self.claims.close()
        self.marks.close()


@dataclass
class _Claiming:
    """A group of URLs read, whose claim runs in the background while the next group is read."""

    candidates: list[Candidate]
    claim: concurrent.futures.Future[ClaimResult]


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
        depth: int | None = None,  # of every URL, in a discovery run (producer/discovery_scope.py)
        threads: PipelineThreads | None = None,
    ) -> None:
        self.run_id = run_id
        self._depth = depth
        self.counts = Counts()
        self._batch_size = batch_size
        self._tasks = TaskMessages(namespace, router)
        self._dedup = dedup
        self._publisher = publisher
        self._clock = clock
        self._sleep = sleep
        self._should_stop = should_stop
        self._patience = Patience(clock, sleep, should_stop, patience_s)
        self._previous_run = previous_run
        # One run per pipeline: run() ends their threads, unless they were lent (`threads`).
        self._lent_threads = threads is not None
        self._threads = threads if threads is not None else PipelineThreads()
        self._claims = self._threads.claims
        self._marks = self._threads.marks
        self._in_flight = BatchesInFlight(
            run_id=run_id,
            counts=self.counts,
            dedup=dedup,
            publisher=publisher,
            marks=self._marks,
            clock=clock,
            patience=self._patience,
            mark_every_urls=DEDUP_GROUP_URLS,
            mark_within_s=MAX_GROUP_HOLD_S,
        )
        # Read and claimed, or being claimed, not yet published; oldest first.
        self._claiming: collections.deque[_Claiming] = collections.deque()
        self._busy: list[Candidate] = []  # claimed by another producer, alive: to ask again
        self._invalid_unreported = 0

    def run(self, entries: Iterable[SitemapEntry]) -> Counts:
        group: list[Candidate] = []
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
                self._in_flight.complete_all()
                self._in_flight.mark_seen()
                self._marks.finish()
            finally:
                if not self._lent_threads:
                    self._threads.close()
        if self._invalid_unreported:
            self._dedup.confirm([], {"invalid": self._invalid_unreported})
        self._log_progress("done")
        return self.counts

    def _take(self, entry: SitemapEntry, group: list[Candidate]) -> None:
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
        group.append(Candidate(entry, canonical, fingerprint(canonical)))

    def _claim(self, group: list[Candidate], again: bool = False) -> None:
        """Start claiming `group` in the background (`again`: URLs found busy before)."""
        if group and self._previous_run is not None and not again:
            group = self._due_again(group, self._previous_run)
        if group:
            fingerprints = [c.fingerprint for c in group]
            claim = functools.partial(
                self._patience.call, "claiming URLs", lambda: self._dedup.claim(fingerprints)
            )
            self._claiming.append(_Claiming(group, self._claims.call(claim)))

    def _claim_busy_again(self) -> None:
        """Ask again for the URLs another producer held while it was alive, until each is settled:
        confirmed by it (a duplicate), released by it, or taken over once it is dead."""
        if self._busy:  # what was published is settled and marked before any wait
            self._in_flight.complete_all()
            self._in_flight.mark_seen()
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
        new: list[Candidate] = []
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
                self._in_flight.make_room()
                self._in_flight.complete_confirmed()
                self._marks.check()  # a failed mark ends the run here rather than at its end
        finally:
            if sent < len(new):  # the run broke off: what was not sent is given back
                self._release_now([c.fingerprint for c in new[sent:]], claim.token)

    def _release_now(self, fingerprints: list[bytes], token: bytes) -> None:
        """Give claims back, in order behind the marks already queued, and wait for it."""
        self._marks.call(lambda: self._dedup.release(fingerprints, token)).result()

    def _submit(self, batch: list[Candidate], token: bytes, duplicates: int, taken: list[bool]) -> None:
        now = self._clock()
        recrawl_of = self._previous_run.run_id if self._previous_run is not None else None
        bodies = TaskBodies(self.run_id, now, recrawl_of, self._depth)
        queues, publications = self._tasks.for_batch(batch, bodies, now)
        outcomes = self._patience.call("publishing", lambda: self._publisher.submit(publications))
        self._in_flight.add(
            PublishedBatch(
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

    def _due_again(self, batch: list[Candidate], previous: PreviousFetches) -> list[Candidate]:
        fetched = self._patience.call(
            "reading the earlier run", lambda: previous.fetched_at([c.canonical for c in batch])
        )
        now = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
        due = [c for c in batch if is_due(c.entry.lastmod, c.entry.changefreq, fetched.get(c.canonical), now)]
        self.counts.not_due += len(batch) - len(due)
        return due

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
