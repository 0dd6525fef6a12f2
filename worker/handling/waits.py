"""A URL that waits in this worker for its domain, rather than going back to the broker: what
its delivery carries while it waits (Waiting, Parked), and the part the handler holds that
holds it (SlotHolds): a URL the domain cannot take for a short while is held unacked until it
can, its slot reserved when the gate could, and a URL that comes while its domain's slot is
held here is parked behind that slot before any handling. worker/handler.py decides when a URL
waits here; a longer wait goes to a defer queue (worker/handling/forwards.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeGuard

from shared import metrics
from shared.consumer import Delivery, Outcome
from shared.errors import PermanentError
from shared.messages import CrawlTask
from shared.settings import Settings
from shared.try_later import HeldSlot, TryLater
from shared.urls import domain_of
from worker.handling.log import log

# Every reason a TryLater is raised with (worker/politeness/gate.py, robots.py, proxies.py): a URL
# waiting for its domain is held or deferred for one of these.
WAIT_REASONS = ("rate", "busy", "paused", "spacing", "robots_pending", "proxies_benched")

# Domains whose held slots a worker remembers (SlotHolds.will_be_held) before it forgets
# the ones whose slots have passed.
SLOTS_REMEMBERED = 4096


@dataclass(frozen=True)
class Waiting:
    """What a held delivery carries (Delivery.memo): since when it has been held, the slot
    reserved for it, if any, and whether the cache was found empty for it."""

    since: float  # time.monotonic()
    slot: HeldSlot | None = None
    cache_missed: bool = False  # the response cache had nothing for the URL when it first came


@dataclass(frozen=True)
class Parked:
    """What a parked delivery carries (CrawlHandler.parked): since when; not handled yet."""

    since: float  # time.monotonic()


def _domain_in(body: bytes) -> str:
    """The domain of a task's URL; "" for a body that is no task (the handler says why)."""
    try:
        return domain_of(CrawlTask.decode(body).url)
    except (PermanentError, ValueError):  # not JSON, not a task, no URL one can split
        return ""


def back_with_its_slot(memo: object) -> TypeGuard[Waiting]:
    """Whether a delivery's memo is that of a URL back from its hold to be sent on the slot
    reserved for it."""
    return isinstance(memo, Waiting) and memo.slot is not None


class SlotHolds:
    """The holds in this worker, held by CrawlHandler (worker/handler.py): the slots it holds
    URLs for, domain by domain, and the URLs parked behind them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Domain -> when the furthest slot this worker holds a URL for comes (time.monotonic()).
        # Replaced, never pruned in place: handler threads read it without a lock.
        self._slots_held: dict[str, float] = {}

    def will_be_held(self, memo: object, url: str) -> bool:
        """Whether this URL, just come (its delivery's `memo`), will be held for its domain's
        slot: this worker holds another URL of the domain for a slot further off than the inline
        wait, and the limiter's slots only move on, so the URL's own comes later still. Such a
        handling only reserves its slot and risks nothing, so it leaves no "handling" marker,
        which would have cost a polite page a round trip of its own to take away again when the
        thread went idle. A guess that proves wrong costs only that: the marker goes before any
        fetch or parse (CrawlHandler._mark_handling)."""
        if self.settings.max_hold_s <= 0 or back_with_its_slot(memo):
            return False  # a held URL's send
        if isinstance(memo, Parked):
            return True  # parked behind a slot held here: its own comes after that one
        return self._wait_behind_slot_held(domain_of(url)) is not None

    def parked(self, delivery: Delivery) -> Outcome | None:
        """On the connection's thread, as a message comes: a hold until its domain's furthest
        slot held in this worker, for a URL that would only reserve a slot after that one and
        be held; None for any other. In a long polite crawl each URL comes alone, as the one
        before it is acked, and a thread woken from its pause for it costs several times what
        the same work costs back to back (docs/POLITENESS.md). Parked, it wakes nothing: the
        timer lets it go with the URL whose slot it waited for, and one thread handles the URLs
        parked meanwhile (checks them, reserves their slots, holds them) in turn. No slot goes
        unused meanwhile: the ones up to the furthest are all reserved already."""
        if self.settings.max_hold_s <= 0 or delivery.memo is not None or not self._slots_held:
            return None  # (a crawl that never waits pays no decoding here)
        wait_s = self._wait_behind_slot_held(_domain_in(delivery.body))
        if wait_s is None:
            return None
        metrics.HOLDS.labels("parked").inc()
        return Outcome.hold(wait_s, Parked(time.monotonic()))

    def _wait_behind_slot_held(self, domain: str) -> float | None:
        """How long until the furthest slot this worker holds a URL of `domain` for, when that
        is beyond the inline wait; else None."""
        held_until = self._slots_held.get(domain)
        if held_until is None:
            return None
        wait_s = held_until - time.monotonic()
        return wait_s if wait_s > self.settings.max_inline_wait_s else None

    def _note_slot_held(self, domain: str, wait_s: float) -> None:
        now = time.monotonic()
        if len(self._slots_held) >= SLOTS_REMEMBERED:
            # A worker holds at most its prefetch of URLs, so few slots are still to come.
            # list(): one call, so another thread's insert cannot break the iteration.
            self._slots_held = {known: due for known, due in list(self._slots_held.items()) if due > now}
        self._slots_held[domain] = now + wait_s

    def wait_here(self, task: CrawlTask, later: TryLater, waiting: Waiting, cache_missed: bool) -> Outcome:
        """Kept unacked in this worker until the domain can take it, its slot (if reserved)
        with it; the fetch thread goes on meanwhile, and a crash gives the URL back to the
        broker like any message in flight. `cache_missed`: the response cache had nothing for
        the URL when it came."""
        log.debug("holding %s for %.3f s (%s)", task.url, later.wait_s, later.reason)
        metrics.HOLDS.labels(later.reason).inc()
        if later.slot is not None:
            self._note_slot_held(later.slot.domain, later.wait_s)
        return Outcome.hold(later.wait_s, Waiting(waiting.since, later.slot, cache_missed))
