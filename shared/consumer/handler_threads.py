"""What the handler threads and the timer thread of the consumer loop (shared/consumer/runtime.py) do.

A handler thread takes a message from the local buffer (shared/consumer/local_buffer.py) and calls the
service's handler, again while what it needs is unavailable, until the stop. What the handler
returns goes on from there: into the timer heap of held messages (shared/consumer/holds.py) for
`Outcome.hold`, to the future's callbacks for `Outcome.after`, and otherwise back to the
connection's thread to be settled (shared/consumer/settling.py). A thread that finds no message waiting
calls the service's idle hooks first. The timer thread hands each held message back to the
buffer when it is due.

Apart from the connection's thread because none of this touches pika: only that thread does.
It calls on this part to park a message as it comes (`_hold`) and, as it stops, for the quiet
hook (`_call_if_quiet`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
from collections.abc import Callable

from tenacity import Retrying, stop_when_event_set

from shared import metrics, retrying
from shared.consumer.deliveries import Delivery, Handler, Outcome, StopEvent
from shared.consumer.holds import HeldMessages
from shared.consumer.local_buffer import LocalItem, LocalQueue
from shared.consumer.settling import Settling
from shared.errors import ServiceUnavailable, one_line

# The loop's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("shared.consumer")  # the name operators know: kept as the module moved


class HandlerThreads(Settling):
    """Part of ConsumerRuntime (shared/consumer/runtime.py), whose __init__ sets what is declared here."""

    handler: Handler
    when_idle: Callable[[], None] | None
    when_quiet: Callable[[], None] | None
    stop_event: StopEvent
    _local: LocalQueue
    _held: HeldMessages[LocalItem]
    _handling_now: int
    _handling_lock: threading.Lock

    def _work(self) -> None:
        while True:
            try:
                item = self._local.get_nowait()
            except queue.Empty:
                self._idle()
                item = self._local.get()  # the stop sends each thread an item too (_wake_threads)
            if item.generation != self._generation:
                # A stale item's channel is gone and the broker has requeued it.
                if self.stop_event.is_set() and self._connection is None:
                    return
                continue
            with self._handling_lock:
                self._handling_now += 1
            try:
                self._work_on(item)
            finally:
                with self._handling_lock:
                    self._handling_now -= 1

    def _work_on(self, item: LocalItem) -> None:
        # A message taken as the stop came was never started: give it back.
        outcome = Outcome.reject(requeue=True) if self.stop_event.is_set() else self._handle(item.delivery)
        if outcome.hold_s is not None:
            self._hold(item, outcome)
        elif outcome.later is not None:
            outcome.later.add_done_callback(functools.partial(self._hand_back_settled, item))
        else:
            self._hand_back(item, outcome)

    def _hold(self, item: LocalItem, outcome: Outcome) -> None:
        assert outcome.hold_s is not None
        metrics.MESSAGES_HELD.inc()  # before the timer can let it go (and dec)
        self._held.hold(
            dataclasses.replace(item, delivery=dataclasses.replace(item.delivery, memo=outcome.memo)),
            outcome.hold_s,
        )

    def _release_held(self) -> None:
        """The timer thread: each held message back to the handler threads when due, and all of
        them at once when the service stops (the handlers then give them back to the broker)."""
        while True:
            stopping = self.stop_event.is_set()
            due = self._held.take_all() if stopping else self._held.take_due()
            # Parked messages are due with the one whose slot they waited for, and their
            # handling is short (a check, a reservation): one thread takes them in turn,
            # instead of a thread woken from its pause for each. A thread of their own, not
            # the send's: that one may wait for a slow site.
            parked = []
            for item in due:
                metrics.MESSAGES_HELD.dec()
                if item.parked:
                    parked.append(item)
                else:
                    self._local.put(item)  # a thread each: each may be a fetch
            if parked:
                self._local.put_together(parked)
            if stopping and self._connection is None:
                return
            self._held.wait_for_next()  # until the next is due; a stop wakes it

    def _idle(self) -> None:
        self._call_hook(self.when_idle)
        self._call_if_quiet()

    def _call_if_quiet(self) -> None:
        if self._quiet():
            self._call_hook(self.when_quiet)

    def _call_hook(self, hook: Callable[[], None] | None) -> None:
        if hook is None:
            return
        try:
            hook()
        except Exception as exc:  # what it sends is best-effort by contract; the thread goes on
            log.warning("%s could not finish its idle work: %s", self.name, one_line(exc))

    def _quiet(self) -> bool:
        """Nothing in hand but what waits on other threads. A message taken from the local
        buffer an instant before its thread counts itself makes this true too early, which
        costs no more than a batch committed a little sooner."""
        if self.when_quiet is None:
            return False
        with self._handling_lock:
            handling = self._handling_now
        return handling == 0 and self._local.empty() and len(self._held) == 0

    def _handle(self, delivery: Delivery) -> Outcome:
        try:
            return self._handling(self.handler, delivery)
        except ServiceUnavailable:  # still unavailable when the stop came
            return Outcome.reject(requeue=True)
        except Exception:
            # A bug, or input nobody foresaw. Dead-letter it rather than crash-loop on it.
            log.exception(
                "%s handler failed on a message from %s; dead-lettering it", self.name, delivery.queue
            )
            return Outcome.reject(requeue=False)

    @functools.cached_property
    def _handling(self) -> Retrying:
        """Calls the handler again while what it needs is unavailable, until the stop. Made once
        and shared by the handler threads (tenacity keeps each thread's state apart): one per
        message would cost more than the call itself."""

        def on_pause(error: BaseException, pause_s: float) -> None:
            log.warning("%s paused: %s; trying again in %.0fs", self.name, error, pause_s)

        return retrying.patiently(
            ServiceUnavailable, stop_when_event_set(self.stop_event), self.stop_event.wait, on_pause
        )
