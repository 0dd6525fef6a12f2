"""What the handler threads and the timer thread of the consumer loop (shared/consumer/runtime.py) do.

A handler thread takes a message from the local buffer (shared/consumer/local_buffer.py) and calls the
service's handler, again while what it needs is unavailable, until the stop. What the handler
returns goes on from there: into the timer heap of held messages (shared/consumer/holds.py) for
`Outcome.hold`, back to the handler once its report is done for `Outcome.back_when`, and
otherwise back to the connection's thread to be settled (shared/consumer/settling.py). A thread
that finds no message waiting calls the service's idle hooks first. The timer thread hands each
held message back to the buffer when it is due.

Messages back with their reports are decided on the connection's thread, in batches
(`decide_returned`): the writer reports a whole batch of rows at once, the first of them wakes
that thread, and it decides every message back by then in turn and settles them in the same
wake. A handler thread woken for them instead cost every stored page's batch one more futex
handoff and GIL switch than its ack needs, and the handler threads more CPU a page (the
contention of one more runnable thread, not more instructions: docs/PERFORMANCE.md). Such a
decision is short and never waits (the worker's: the report's error, a metric, a mark queued),
which `Outcome.back_when` asks of a handler.

Apart from the connection's thread because none of the rest touches pika: only that thread
does. It calls on this part to park a message as it comes (`hold`), to decide the messages back
(`decide_returned`) and, as it stops, for the quiet hook (`call_if_quiet`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from tenacity import Retrying, stop_when_event_set

from shared import metrics, retrying
from shared.amqp import broker
from shared.consumer.deliveries import ConsumerHooks, Delivery, Handler, Outcome, StopEvent
from shared.consumer.holds import HeldMessages
from shared.consumer.local_buffer import LocalItem, LocalQueue
from shared.consumer.settling import CurrentConnection, Settling
from shared.errors import ServiceUnavailable, one_line

# The loop's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("shared.consumer")  # the name operators know: kept as the module moved

# Messages back with their reports decided before they are settled together, at most: a few
# writer's batches, so that reports which keep coming do not hold acks back.
DECIDED_SETTLED_AT = 256


class HandlerThreads:
    """`concurrency` threads calling `handler` on the messages of `local`, and the timer thread
    of `held`; what they decide goes to `settling`. Built and started by ConsumerRuntime
    (shared/consumer/runtime.py); `handle` alone needs nothing started."""

    def __init__(
        self,
        name: str,
        handler: Handler,
        concurrency: int,
        stop_event: StopEvent,
        hooks: ConsumerHooks,
        current: CurrentConnection,
        settling: Settling,
    ) -> None:
        self.name = name
        self.handler = handler
        self.concurrency = concurrency
        self.stop_event = stop_event
        # Called on a handler thread that finds no message waiting, before it waits for one:
        # the handler's chance to send what it held back for its next message (the worker's
        # deferred Redis writes).
        self.when_idle = hooks.when_idle
        self.when_quiet = hooks.when_quiet
        self.current = current
        self.settling = settling
        self.local = LocalQueue()
        self.held: HeldMessages[LocalItem] = HeldMessages(time.monotonic)
        self.seq = itertools.count()  # the arrival order of the messages put in `local`
        self._handling_now = 0  # handler threads between taking a message and handing it on
        self._handling_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Messages back with their reports, to be decided on the connection's thread: the first
        # into an empty deque wakes it, and one wake serves all that come until it empties it.
        self._returned: collections.deque[LocalItem] = collections.deque()
        self._returned_lock = threading.Lock()

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        self._threads.append(
            threading.Thread(target=self._release_held, name=f"{self.name}-held", daemon=True)
        )
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> None:
        for thread in self._threads:
            thread.join(timeout=timeout_s)

    def wake(self) -> None:
        """Wake the idle handler threads and the timer, to see that the service stops."""
        self.held.wake()
        for _ in range(self.concurrency):  # of no generation: a thread that takes one looks at the stop flag
            self.local.put(LocalItem(-1, 0, next(self.seq), -1, 0, Delivery("", b"", {}, False)))

    def _work(self) -> None:
        while True:
            try:
                item = self.local.get_nowait()
            except queue.Empty:
                self._idle()
                item = self.local.get()  # the stop sends each thread an item too (wake)
            if item.generation != self.current.generation:
                # A stale item's channel is gone and the broker has requeued it.
                if self.stop_event.is_set() and self.current.connection is None:
                    return
                continue
            with self._handling_lock:
                self._handling_now += 1
            try:
                self._work_on(item)
            except Exception:
                # Our bug in settling an outcome: the message stays unacked until its channel
                # closes (and the broker requeues it); the thread goes on with the next.
                log.exception("%s could not settle a message", self.name)
            finally:
                with self._handling_lock:
                    self._handling_now -= 1

    def _work_on(self, item: LocalItem) -> None:
        """Handle one message taken from the buffer, on a handler thread."""
        # A message taken as the stop came was never started: give it back.
        if self.stop_event.is_set():
            self._hand_on(item, Outcome.reject(requeue=True))
        else:
            self._hand_on(item, self.handle(item.delivery))

    def _hand_on(
        self, item: LocalItem, outcome: Outcome, decided: list[tuple[LocalItem, Outcome]] | None = None
    ) -> None:
        """Where the handler's outcome takes the message: held, waiting for its report, or
        handed back to the settling at once (or added to `decided`, settled with others)."""
        if outcome.hold_s is not None:
            self.hold(item, outcome)
        elif outcome.report is not None:
            outcome.report.add_done_callback(functools.partial(self._back_with_report, item, outcome.memo))
        elif decided is not None:
            decided.append((item, outcome))
        else:
            self.settling.hand_back(item, outcome)

    def _back_with_report(self, item: LocalItem, memo: object, _report: object) -> None:
        """On the thread that resolved the report: the message back, with `memo` for the
        handler, to be decided on the connection's thread. The first of a batch wakes it for
        them all."""
        delivery = item.delivery
        back = LocalItem(
            item.rank,
            item.priority,
            item.seq,
            item.generation,
            item.tag,
            # Built, not dataclasses.replace'd: this runs for every stored page, and replace costs
            # a few microseconds more (it reads the fields anew each time).
            Delivery(
                delivery.queue, delivery.body, delivery.headers, delivery.redelivered, delivery.priority, memo
            ),
            item.parked,
        )
        with self._returned_lock:
            first = not self._returned
            self._returned.append(back)
        connection = self.current.connection
        if first and connection is not None:  # otherwise a wake is on its way, or none is needed
            # If the connection closed meanwhile, the broker requeues the message by itself;
            # and if the wake is lost with it, the loop's next pass decides what waits.
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.add_callback_threadsafe(self.decide_returned)

    def decide_returned(self) -> None:
        """On the connection's thread: every message back with its report, decided in turn,
        those that come meanwhile too, and settled together once none is left, so that what
        may be joined of theirs is (a discovery run's links, shared/consumer/settling.py).
        Called by each wake, and on every pass of the loop, so a wake lost with a connection
        strands nothing."""
        decided: list[tuple[LocalItem, Outcome]] = []
        while True:
            with self._returned_lock:
                if not self._returned:
                    break
                item = self._returned.popleft()
            if item.generation != self.current.generation:
                continue  # from a channel since closed: the broker has requeued it
            try:
                # Even once the stop came: its handling is done but for the decision (a page
                # whose row is committed is acked). Never waited out on this thread: pika waits.
                self._hand_on(item, self.handle(item.delivery, wait_out=False), decided)
            except Exception:
                # Our bug past the handler (which catches its own): this message stays unacked
                # until its channel closes; the others are decided all the same.
                log.exception("%s could not decide a message back with its report", self.name)
            if len(decided) >= DECIDED_SETTLED_AT:  # reports that never stop coming
                self.settling.settle_now(decided)
                decided = []
        if decided:
            self.settling.settle_now(decided)

    def hold(self, item: LocalItem, outcome: Outcome) -> None:
        assert outcome.hold_s is not None
        metrics.MESSAGES_HELD.inc()  # before the timer can let it go (and dec)
        self.held.hold(
            dataclasses.replace(item, delivery=dataclasses.replace(item.delivery, memo=outcome.memo)),
            outcome.hold_s,
        )

    def _release_held(self) -> None:
        """The timer thread: each held message back to the handler threads when due, and all of
        them at once when the service stops (the handlers then give them back to the broker)."""
        while True:
            stopping = self.stop_event.is_set()
            due = self.held.take_all() if stopping else self.held.take_due()
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
                    self.local.put(item)  # a thread each: each may be a fetch
            if parked:
                self.local.put_together(parked)
            if stopping and self.current.connection is None:
                return
            self.held.wait_for_next()  # until the next is due; a stop wakes it

    def _idle(self) -> None:
        self._call_hook(self.when_idle)
        self.call_if_quiet()

    def call_if_quiet(self) -> None:
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
        return handling == 0 and self.local.empty() and len(self.held) == 0

    def handle(self, delivery: Delivery, wait_out: bool = True) -> Outcome:
        """The handler's outcome for `delivery`: after waiting out an unavailable service
        (`wait_out`; else it goes back to its queue), and a reject when the handler fails."""
        try:
            try:
                # Called plainly first: the retrying loop costs a few microseconds a call, and is
                # only needed once a service is away.
                return self.handler(delivery)
            except ServiceUnavailable as outage:
                if not wait_out:
                    raise
                # The loop goes on from this first failure: its first pause, log line and stop
                # check as if it had made the call itself.
                return self._handling(_FailedOnce(outage, self.handler), delivery)
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


class _FailedOnce:
    """`handler` for a retrying loop, whose first call already failed with `error`: the loop's
    first attempt raises it again, and its later attempts call the handler."""

    def __init__(self, error: ServiceUnavailable, handler: Handler) -> None:
        self.error: ServiceUnavailable | None = error
        self.handler = handler

    def __call__(self, delivery: Delivery) -> Outcome:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return self.handler(delivery)
