"""The batches the producer has published and not yet settled, from the broker's confirms to
the dedup store:

    published → confirmed: marked seen (a group at a time) + counted
              → not confirmed: published again, up to PUBLISH_ATTEMPTS; then un-marked + counted

Marks and un-marks run on the loop's marks thread (producer/background.py), in order with the
releases the loop queues there; nothing waits for them, but an error among them still ends the
run when the loop next checks that thread.

Apart from the loop (producer/pipeline.py), which reads, claims and publishes and hands each
batch it published to BatchesInFlight: here is everything that happens to a batch after that.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from producer.background import Background
from producer.patience import PUBLISH_ATTEMPTS, Patience
from producer.pipeline_types import Counts, DedupStore, Outcomes, Publisher
from shared import metrics
from shared.amqp.broker import Publication
from shared.errors import ServiceUnavailable
from shared.messages import QUEUE_KINDS

# The producer's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("producer.pipeline")

BATCHES_IN_FLIGHT = 8


@dataclass
class PublishedBatch:
    fingerprints: list[bytes]
    queues: list[str]  # the kind of queue each URL went to
    publications: list[Publication]
    token: bytes
    outcomes: Outcomes
    duplicates: int
    invalid: int
    taken: list[bool]  # whether each URL's claim was taken over from a dead producer


class BatchesInFlight:
    """The published batches, oldest first, each settled once its confirms are in; and the
    confirmed URLs not yet marked seen."""

    def __init__(
        self,
        *,
        run_id: str,
        counts: Counts,
        dedup: DedupStore,
        publisher: Publisher,
        marks: Background,
        clock: Callable[[], float],
        patience: Patience,
        mark_every_urls: int,
        mark_within_s: float,
    ) -> None:
        self._run_id = run_id
        self._counts = counts
        self._dedup = dedup
        self._publisher = publisher
        self._marks = marks
        self._clock = clock
        self._patience = patience
        self._mark_every_urls = mark_every_urls
        self._mark_within_s = mark_within_s
        self._batches: collections.deque[PublishedBatch] = collections.deque()
        self._unmarked: list[bytes] = []  # confirmed, to be marked seen with the next group
        self._unmarked_counters: collections.Counter[str] = collections.Counter()
        self._marked_at = clock()  # when confirmed URLs were last marked seen

    def add(self, batch: PublishedBatch) -> None:
        self._batches.append(batch)

    def make_room(self) -> None:
        """Settle the oldest batches, waiting for their confirms, until fewer than
        BATCHES_IN_FLIGHT are in flight."""
        while len(self._batches) >= BATCHES_IN_FLIGHT:
            self._complete(self._batches.popleft())

    def complete_confirmed(self) -> None:
        """Settle the batches whose confirms are all in, oldest first, without waiting: their
        URLs are marked seen soon, not only once more batches push them out, so a kill -9
        leaves few confirmed URLs unmarked (each such URL is published again by the next run)."""
        while self._batches and getattr(self._batches[0].outcomes, "done", lambda: False)():
            self._complete(self._batches.popleft())

    def complete_all(self) -> None:
        """Settle every batch in flight, waiting for their confirms."""
        while self._batches:
            self._complete(self._batches.popleft())

    def mark_seen(self) -> None:
        """Mark the URLs confirmed since the last time seen for good, and add up their counts.
        Marks need not hold up the loop: they run in the background, in order, and an error among
        them still ends the run, at the next batch sent or once all is settled."""
        self._marked_at = self._clock()
        fingerprints, self._unmarked = self._unmarked, []
        counters, self._unmarked_counters = dict(self._unmarked_counters), collections.Counter()
        if fingerprints or any(counters.values()):
            self._marks.call_unwatched(
                lambda: self._patience.call(
                    "marking URLs seen", lambda: self._dedup.confirm(fingerprints, counters)
                )
            )

    def _complete(self, item: PublishedBatch) -> None:
        waiting_since = self._clock()
        failed = [i for i, ok in enumerate(item.outcomes.wait()) if not ok]
        self._counts.unconfirmed += len(failed)
        try:
            for attempt in self._patience.publish_attempts():
                with attempt:
                    if attempt.retry_state.attempt_number > 1:  # the first is the batch's own publish
                        failed = self._publish_again(item, failed)
                outcome = attempt.retry_state.outcome
                if outcome is not None and not outcome.failed:
                    attempt.retry_state.set_result(failed)  # what decides whether to try again
        except ServiceUnavailable as exc:
            log.error("cannot retry publishes: %s", exc)
        waited_s = self._clock() - waiting_since
        self._counts.confirm_wait_max_s = max(self._counts.confirm_wait_max_s, waited_s)
        self._settle(item, set(failed))

    def _publish_again(self, item: PublishedBatch, failed: list[int]) -> list[int]:
        """Publish the batch's `failed` publications again; returns those still not confirmed."""
        again = [item.publications[i] for i in failed]
        retried = self._patience.call(
            "re-publishing", functools.partial(self._publisher.publish_batch, again)
        )
        return [i for i, ok in zip(failed, retried, strict=True) if not ok]

    def _settle(self, item: PublishedBatch, failed: set[int]) -> None:
        confirmed = [i for i in range(len(item.queues)) if i not in failed]
        # A render kind appears in the figures only once a routing rule sends a URL there.
        added = dict.fromkeys(QUEUE_KINDS, 0)
        for i in confirmed:
            added[item.queues[i]] = added.get(item.queues[i], 0) + 1
        republished = sum(1 for i in confirmed if item.taken[i])
        counters = {f"enqueued.{kind}": n for kind, n in added.items()}
        # taken_over is counted in Redis by the claim itself (producer/dedup.py).
        counters.update(duplicates=item.duplicates, invalid=item.invalid, republished=republished)
        self._unmarked += [item.fingerprints[i] for i in confirmed]
        self._unmarked_counters.update(counters)
        # Marked a group at a time, or sooner when URLs come slowly: a URL confirmed but not
        # marked is what a kill -9 leaves to be published again.
        if (
            len(self._unmarked) >= self._mark_every_urls
            or self._clock() - self._marked_at >= self._mark_within_s
        ):
            self.mark_seen()
        if failed:
            failed_fps = [item.fingerprints[i] for i in sorted(failed)]
            self._marks.call_unwatched(
                lambda: self._patience.call(
                    "un-marking URLs", lambda: self._dedup.release(failed_fps, item.token)
                )
            )
            self._counts.publish_failed += len(failed)
            log.error(
                "gave up on %d URLs after %d publish attempts (un-marked, a re-run with "
                "run id %s will try them again)",
                len(failed),
                PUBLISH_ATTEMPTS,
                self._run_id,
            )
        for kind, n in added.items():
            self._counts.enqueued[kind] = self._counts.enqueued.get(kind, 0) + n
            if n:
                metrics.URLS_ENQUEUED.labels(kind).inc(n)
        self._counts.duplicates += item.duplicates
        self._counts.republished += republished
        metrics.URL_DUPLICATES.inc(item.duplicates)
