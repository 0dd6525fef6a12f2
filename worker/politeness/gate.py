"""How hard the worker may press on one domain, and the gate every request to it goes through.

Per domain, shared by every worker through Redis (docs/POLITENESS.md):

- a request rate: RATE_LIMIT_RPS, or the domain's own line in POLITENESS_FILE, lowered by a
  robots.txt Crawl-delay, and by the adaptive slow-down after a 429 or 503 without Retry-After,
  a burst of 403s or rising latency (worker/politeness/latency_watch.py), which recovers by itself;
- a cap on requests in flight: MAX_CONCURRENT_PER_DOMAIN, or the domain's own line;
- a pause a server asked for with Retry-After.

`DomainGate.call(domain, send)` waits for a slot (in-process when the wait is short), sends,
and reports throttling answers back to the shared state. When the wait would be long it raises
TryLater, which is not a failure: the handler holds the URL unacked in the worker until then, or
(a wait beyond MAX_HOLD_S) sends it back through a defer queue, without charging it an attempt.
A caller that can hold its URL (`may_hold`) gets its slot reserved up to MAX_HOLD_S ahead:
TryLater then carries a `HeldSlot`, and the call made with that slot when it is due sends at
once, after one Redis check, instead of asking for a slot again. Waiters hold reservations, so
they neither poll Redis nor bounce through the broker while they wait. Threads refused because
the domain's concurrency slots are all taken wait in one line a domain a process, and only the
thread at its head asks Redis again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from shared.errors import PermanentError
from shared.settings import Settings
from shared.try_later import HeldSlot, TryLater
from worker.fetch.verdicts import Throttled
from worker.politeness.config import PolitenessConfig
from worker.politeness.domain_limiter import DomainLimiter, Reservation
from worker.politeness.gate_waits import Waits
from worker.politeness.latency_watch import LatencyWatch
from worker.politeness.lines import Lines, Turn

log = logging.getLogger("worker.politeness")  # the name operators know: kept as the module moved

T = TypeVar("T")

# The limiter aims this much under the configured rate. A server sees each request a little
# after it leaves (a new connection, the server's own scheduling), by a varying amount; with
# requests exactly 1/rate apart, R+1 of them can then land in one second. Stretching the interval
# by 5% leaves 50 ms for such jitter in every one-second window, at any rate, and keeps 95% of
# the allowed throughput (docs/POLITENESS.md).
RATE_HEADROOM = 1.05
BUSY_POLL_S = 0.05  # how often the head of a busy domain's line asks again (DomainGate._lines)
BUSY_RETRY_S = 1.0  # a URL deferred for concurrency comes back after about this long
LEASE_MARGIN_S = 5.0  # a concurrency lease outlives the longest possible fetch by this much
MAX_SPACING_WAITS = 5  # a request nudged back (clear_to_send) more often than this is deferred
# A held URL wakes when its slot is due, but a request sent late keeps the next one back by as
# much, and so on down the line: about half the held sends found a few ms of spacing left (3-30
# ms, one host at 2 requests/s), and paid a second check for it. Within this much, the check
# clears the send for the moment it may go, and the URL sleeps once. A pause that begins
# meanwhile is met by the requests after it, as by one already in flight.
CLEAR_AHEAD_S = 0.1
# A send is recorded in Redis as it is cleared, and the next request is spaced from that. One
# that leaves later (a thread waking late, or reading its clearance late, on a busy machine)
# would reach the site less than an interval before the next one, cleared on time: at the start
# of a 12-worker crawl on two cores, a page left about 100 ms late and the next 0.433 s after it,
# three requests in one second at 2 a second. A send later than its interval's headroom (25 ms
# at 2 a second), and than this, moves the domain's latest send up to its real time: one more
# Redis round trip, for a late send only.
LATE_SEND_MIN_S = 0.02
FORBIDDEN = 403
# So many 403s within the limiter's burst window slow the domain down: a site refusing a
# crawler that presses too hard; fewer are single forbidden pages.
FORBIDDEN_BURST = 3


class DomainGate:
    """Every request to a domain goes through `call`, robots.txt included."""

    def __init__(
        self,
        limiter: DomainLimiter,
        config: PolitenessConfig,
        settings: Settings,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limiter = limiter
        self._config = config
        self._max_inline_wait_s = settings.max_inline_wait_s
        self._max_hold_s = settings.max_hold_s
        self._max_pause_s = settings.max_domain_pause_s
        self._lease_s = settings.fetch_deadline_s + LEASE_MARGIN_S
        self._sleep = sleep
        self._clock = clock
        # Threads refused for a domain whose concurrency slots are all taken line up, one line
        # a domain: the thread at the head asks the shared limiter again every BUSY_POLL_S, the
        # others wait without asking. When each thread asked on its own, 12 workers of 24
        # threads on one site capped at 8 made 50-62 Redis round trips a page, against 12-16
        # in line (docs/POLITENESS.md, "Concurrency cap").
        self._lines = Lines()
        self._latency = LatencyWatch()

    def call(
        self,
        domain: str,
        send: Callable[[], T],
        crawl_delay_s: float | None = None,
        *,
        may_hold: bool = False,
        slot: HeldSlot | None = None,
        spaced_from_answer: bool = False,
    ) -> T:
        """Send once the domain allows; raise TryLater if that is more than a short wait away.

        `may_hold`: the caller can hold its URL, so a slot up to MAX_HOLD_S ahead is reserved
        for it (TryLater.slot). `slot`: such a slot, now due. `spaced_from_answer`: the next
        request to the domain is spaced from this one's answer, not from its clearance. For
        robots.txt, a domain's first request: it is made while a worker starts, with every
        thread after it. At the start of a crawl with 12 workers on two cores, the first page,
        cleared 0.525 s after robots.txt was, reached the site 0.467 s after it: three requests
        in one second at 2 a second. One Redis write a domain a day."""
        policy = self._config.policy_for(domain)
        rate = policy.rate_per_s(crawl_delay_s)
        waited = Waits(self._sleep)
        reservation = Reservation(0.0, False)
        try:
            if slot is not None and slot.domain == domain:
                reservation = self._send_held(slot, rate, policy.max_concurrent, waited)
            else:
                reservation = self._admit(domain, rate, policy.max_concurrent, waited, may_hold)
                if reservation.wait_s > 0:
                    waited.sleep(reservation.wait_s)
            spacing_s = RATE_HEADROOM / rate * reservation.backoff
            # Requests leave a whole interval apart even when one of them woke late. (A held
            # slot's send was cleared by _send_held.) The limiter stretches the spacing by the
            # domain's slow-down as it is now.
            if not reservation.cleared:
                self._clear_to_send(domain, RATE_HEADROOM / rate, waited)
            waited.count()
            self._note_if_late(domain, spacing_s, waited.cleared_for)
            sent_at = self._clock()
            result = send()
            if spaced_from_answer:
                self._limiter.space_from_now(domain, spacing_s)
        except Throttled as exc:
            self._throttled(domain, exc, rate)
            raise
        except PermanentError as exc:
            if exc.http_status == FORBIDDEN:  # a burst of them slows the domain down
                self._limiter.slow_down(domain, rate, why="403", burst=FORBIDDEN_BURST)
            raise
        finally:
            waited.count()  # a wait that ended in TryLater was a wait too
            if reservation.lease:
                self._limiter.release(domain, reservation.lease)
        if self._latency.rising(domain.lower(), self._clock() - sent_at):
            multiplier = self._limiter.slow_down(domain, rate, why="latency")
            log.warning("%s answers slower and slower: interval now x%.2f", domain, multiplier)
        return result

    def _admit(
        self, domain: str, rate: float, max_concurrent: int, waited: Waits, may_hold: bool = False
    ) -> Reservation:
        deadline = self._clock() + self._max_inline_wait_s
        reservation = self._reserve(domain, rate, max_concurrent, deadline, may_hold, waited)
        if reservation is not None:
            return reservation
        # All the domain's concurrency slots are taken; one usually frees within a fetch.
        reservation = self._wait_in_line(
            domain.lower(),
            deadline,
            waited,
            lambda: self._reserve(domain, rate, max_concurrent, deadline, may_hold, waited),
        )
        if reservation is None:
            raise TryLater(BUSY_RETRY_S, "busy")
        return reservation

    def _wait_in_line(
        self, domain: str, deadline: float, waited: Waits, ask: Callable[[], Reservation | None]
    ) -> Reservation | None:
        """`ask` again, every BUSY_POLL_S until `deadline`, until it stops answering None (all the
        domain's concurrency slots taken), at the head of the domain's line: the process's other
        threads refused for the domain wait behind, without asking. None if the wait ran out."""
        started = self._clock()
        with self._lines.turn(domain, deadline - started) as turn:
            if turn is not Turn.AT_ONCE and deadline > started:  # it stood in line
                waited.add(self._clock() - started)
            ask_now = turn is Turn.AFTER_OTHERS  # the thread ahead just left: a slot is likely free
            while turn is not Turn.MISSED:
                if not ask_now:
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        break
                    waited.sleep(min(BUSY_POLL_S, remaining))
                ask_now = False
                reservation = ask()
                if reservation is not None:
                    return reservation
        return None

    def _reserve(
        self, domain: str, rate: float, max_concurrent: int, deadline: float, may_hold: bool, waited: Waits
    ) -> Reservation | None:
        """One ask of the shared limiter: the reservation, TryLater when the rate or a pause
        keeps the domain, or None when its concurrency slots are all taken."""
        asked = self._clock()
        remaining = max(0.0, deadline - asked)
        horizon_s = max(self._max_hold_s, self._max_inline_wait_s) if may_hold else 0.0
        reservation = self._limiter.reserve(
            domain,
            rate / RATE_HEADROOM,
            max_wait_s=max(remaining, horizon_s),
            max_concurrent=max_concurrent,
            lease_s=self._lease_s,
            lease_within_s=remaining if may_hold else None,
        )
        if reservation.reserved and reservation.wait_s > remaining:
            # Reserved beyond the in-process wait: the URL is held until its slot.
            due = self._clock() + reservation.wait_s
            slot = HeldSlot(domain.lower(), due, reservation.backoff)
            raise TryLater(reservation.wait_s, "rate", slot)
        if reservation.reserved:
            if reservation.cleared:
                waited.cleared_for = asked
            return reservation
        if reservation.reason == "busy":
            return None
        # Come back when the slot is within reach, not when it is due: then there is always a
        # URL waiting for the domain's next slot.
        back_s = max(0.0, reservation.wait_s - max(remaining, horizon_s))
        if may_hold:
            # Not sooner than a quarter of the horizon, though: while more URLs wait than the
            # horizon holds, the newest take the slots coming within reach, and URLs that came
            # back just short of one would ask again and again.
            back_s = max(back_s, horizon_s / 4)
        raise TryLater(back_s, reservation.reason)

    def _send_held(self, slot: HeldSlot, rate: float, max_concurrent: int, waited: Waits) -> Reservation:
        """The send of a slot reserved ahead: one check (pause, spacing, concurrency lease)."""
        early_s = slot.due - self._clock()
        if early_s > 0:
            waited.sleep(early_s)
        deadline = self._clock() + self._max_inline_wait_s
        spacing_s = RATE_HEADROOM / rate  # stretched by the limiter, by the slow-down now
        reservation = self._clear_held(slot, spacing_s, max_concurrent, deadline, waited)
        if reservation is not None:
            return reservation
        reservation = self._wait_in_line(
            slot.domain,
            deadline,
            waited,
            lambda: self._clear_held(slot, spacing_s, max_concurrent, deadline, waited),
        )
        if reservation is None:  # the slot is spent; the URL takes its turn again
            raise TryLater(BUSY_POLL_S, "busy")
        return reservation

    def _clear_held(
        self, slot: HeldSlot, spacing_s: float, max_concurrent: int, deadline: float, waited: Waits
    ) -> Reservation | None:
        """The held send's check until it clears, TryLater for a pause or a wait past `deadline`,
        or None when the domain's concurrency slots are all taken."""
        while True:
            asked = self._clock()
            cleared, wait_s, reason, lease = self._limiter.clear_held(
                slot.domain, spacing_s, max_concurrent, self._lease_s, ahead_s=CLEAR_AHEAD_S
            )
            if cleared:
                waited.cleared_for = asked + wait_s
                if wait_s > 0:
                    waited.sleep(wait_s)  # recorded as sent then: no second check
                return Reservation(0.0, True, lease=lease, backoff=slot.backoff, cleared=True)
            if reason == "busy":
                return None
            if reason == "paused" or self._clock() + wait_s > deadline:
                # The slot is spent; the URL takes its turn again.
                raise TryLater(wait_s, reason)
            waited.sleep(wait_s)

    def _clear_to_send(self, domain: str, spacing_s: float, waited: Waits) -> None:
        """Wait, briefly, until the previous request to the domain is far enough behind us."""
        for _ in range(MAX_SPACING_WAITS):
            asked = self._clock()
            cleared, wait_s, reason = self._limiter.clear_to_send(domain, spacing_s)
            if cleared:
                waited.cleared_for = asked
                return
            if reason == "paused":  # a 429 arrived while we slept towards our slot
                raise TryLater(wait_s, "paused")
            waited.sleep(wait_s)
        raise TryLater(0.0, "spacing")

    def _note_if_late(self, domain: str, spacing_s: float, cleared_for: float | None) -> None:
        """Space the domain's next request from now if this send leaves later than the moment
        it was cleared for (asked, plus any wait it was cleared ahead by) by more than the
        interval's headroom."""
        if cleared_for is None:
            return
        late_s = self._clock() - cleared_for
        if late_s > max(spacing_s - spacing_s / RATE_HEADROOM, LATE_SEND_MIN_S):
            log.debug("%s: a send %.0f ms late; the next is spaced from it", domain, late_s * 1000)
            self._limiter.space_from_now(domain, spacing_s)

    def _throttled(self, domain: str, exc: Throttled, rate: float) -> None:
        if exc.retry_after_s is not None and exc.retry_after_s > 0:
            pause_s = min(exc.retry_after_s, self._max_pause_s)
            self._limiter.pause(domain, pause_s)
            log.warning("%s answered %s: pausing the domain for %.1f s", domain, exc.http_status, pause_s)
        else:
            multiplier = self._limiter.slow_down(domain, rate, why=str(exc.http_status))
            log.warning(
                "%s answered %s without Retry-After: interval now x%.2f", domain, exc.http_status, multiplier
            )
