"""The one consumer loop every service uses: receive → handle on a thread → settle on the connection's thread.

pika is not thread-safe and a BlockingConnection does its I/O (heartbeats included) only inside
pika calls, so the connection's thread never runs handlers: it sits in `process_data_events`
and handlers run on `concurrency` threads. A handler returns an Outcome; the thread hands it
back with `add_callback_threadsafe`, and the connection's thread publishes what the outcome asks
(waiting for each confirm) and only then acks. A crash anywhere before the ack leaves the
message unacked, and the broker delivers it again.

A handler that cannot finish a message yet returns `Outcome.hold(seconds, memo)`: the message
stays unacked in a timer heap (shared/holds.py) and goes back to a handler thread when due, with
`memo` in `Delivery.memo`; the thread meanwhile takes other messages. Held messages count against
the prefetch, which is what bounds them. A stopping service gives them back to the broker.
A service may also hold a message as it comes, before any handler thread sees it (`park`, on
the connection's thread): the worker parks a URL whose domain already waits in it. Parked
messages that come due together go to one handler thread, which takes them in turn.

A handler whose last step finishes on another thread (the worker's batched database commit)
returns `Outcome.after(settled)`: its thread goes on to the next message at once, and the
outcome is handed back when `settled` resolves. Until then the message stays unacked, and
counts against the prefetch like any other. `when_quiet` is called on the handler thread that
finds the service with nothing else in hand (no message waiting or held, no other thread
handling one): what waits on another thread then waits for nothing (the worker commits its
batch at once).

Deliveries carry the generation of the connection they came on. After a reconnect the broker
has already requeued everything unacked, so outcomes from an older generation are dropped.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import stop_when_event_set

from shared import broker, metrics, pika_compat, retrying
from shared.deliveries import Delivery, Handler, Outcome, StopEvent, Subscription
from shared.errors import ServiceUnavailable, one_line
from shared.handler_threads import HandlerThreads
from shared.holds import HeldMessages
from shared.local_buffer import LocalItem, LocalQueue
from shared.settings import Settings
from shared.signals import off_the_handler
from shared.topology import build_topology

log = logging.getLogger(__name__)

# Services and their tests import the consumer's interface from here, wherever its parts live.
__all__ = [
    "POLL_S",
    "ConsumerRuntime",
    "Delivery",
    "Handler",
    "Outcome",
    "StopEvent",
    "Subscription",
    "run_consumers",
]

# A stopping service waits at most this long for in-flight messages; the rest go back to their
# queue. Keeps the whole stop under the 30 s that supervisors usually allow before SIGKILL.
MAX_DRAIN_S = 25.0
RECOVERABLE: tuple[type[BaseException], ...] = (ServiceUnavailable, *broker.CONNECTION_ERRORS)
# The longest the connection's thread stays in pika at a time. Everything it waits for wakes it
# at once (a delivery, a handler's outcome, the stop: StopEvent), and pika sends and checks
# heartbeats inside the call however long it lasts, so this is only a backstop (an outcome whose
# wake went to a connection that has since been replaced). Every wake costs a waiting worker
# CPU for the whole of a slow, polite crawl; it stays well under HEARTBEAT_S / 2 (10 s) all the
# same.
POLL_S = 5.0


class ConsumerRuntime(HandlerThreads):
    def __init__(
        self,
        settings: Settings,
        name: str,
        subscriptions: Sequence[Subscription],
        handler: Handler,
        concurrency: int,
        stop_event: StopEvent | None = None,
        when_idle: Callable[[], None] | None = None,
        private_api: bool = True,
        park: Callable[[Delivery], Outcome | None] | None = None,
        when_quiet: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.subscriptions = list(subscriptions)
        self.handler = handler
        # Asked on the connection's thread as each message comes: a hold outcome keeps it in the
        # timer heap before any handler thread wakes for it (a worker's URL whose domain is
        # already waiting here); None hands it to the handler threads.
        self.park = park
        # Called on a handler thread that finds no message waiting, before it waits for one:
        # the handler's chance to send what it held back for its next message (the worker's
        # deferred Redis writes).
        self.when_idle = when_idle
        self.when_quiet = when_quiet
        self.concurrency = concurrency
        self.stop_event = stop_event or StopEvent()
        self.stop_event.when_set(self._wake_connection)
        self.reconnects = 0
        # Higher consumer priority = served first from the local buffer too.
        ranks = sorted({s.consumer_priority for s in subscriptions}, reverse=True)
        self._rank = {s.queue: ranks.index(s.consumer_priority) for s in subscriptions}
        self._local = LocalQueue()
        self._seq = itertools.count()
        self._generation = 0
        self._connection: Any = None
        self._channel: Any = None
        self._publish_channel: Any = None
        # False: acks through pika's public API only (shared/pika_compat.py); the same acks, slower.
        self._private_api = private_api
        self._ack: Callable[[int], None] = lambda _tag: None  # set with each channel
        self._unsettled: set[int] = set()  # delivery tags of this generation not yet settled
        # Outcomes handed back by handler threads, settled on the connection's thread. One wake
        # of that thread settles all that are waiting: a wake per outcome costs a pipe write and
        # a GIL handoff each. The loop also settles them after each (re)connect and every
        # POLL_S, so none can be stranded by a wake that went to a connection since replaced.
        self._settled: collections.deque[tuple[int, int, Outcome]] = collections.deque()
        self._settled_lock = threading.Lock()
        self._held: HeldMessages[LocalItem] = HeldMessages(time.monotonic)
        self._handling_now = 0  # handler threads between taking a message and handing it on
        self._handling_lock = threading.Lock()

    # ---- the connection's thread ------------------------------------------------------------

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        threads.append(threading.Thread(target=self._release_held, name=f"{self.name}-held", daemon=True))
        for thread in threads:
            thread.start()
        try:
            self._consume()
        finally:
            # The threads sleep until woken, with no timeout: however the run ends, wake them.
            self._forget_connection()
            self._wake_threads()
        for thread in threads:
            thread.join(timeout=self.settings.fetch_deadline_s + 5)
        return 0

    def _consume(self) -> None:
        if not self.stop_event.is_set():
            try:
                self._connect()
            except RECOVERABLE as exc:  # never connected: a setting is wrong, or the broker is not up
                self.stop_event.set()
                raise (
                    exc if isinstance(exc, ServiceUnavailable) else broker.unavailable(self.settings, exc)
                ) from None
        while self._connection is not None:  # None once lost and the stop came before a reconnect
            try:
                while not self.stop_event.is_set():
                    self._settle_waiting()
                    self._connection.process_data_events(time_limit=POLL_S)
                self._drain()
                break
            except RECOVERABLE as exc:
                self._forget_connection()
                self._reconnect(exc)

    def _reconnect(self, lost: BaseException) -> None:
        """Connect again after `lost` ended the connection, with growing pauses, until connected
        or stopped. The pauses start again from the first after each connection made."""
        # tenacity pauses after a failed attempt, and a pause must come before the first
        # reconnect too: the loss itself is taken as the first failed attempt.
        loss: BaseException | None = lost

        def connect() -> None:
            nonlocal loss
            if loss is not None:
                error, loss = loss, None
                raise error
            if self.stop_event.is_set():  # the stop came during the pause: no connection, the run ends
                return
            self._connect()
            self.reconnects += 1
            log.warning("%s reconnected to RabbitMQ (reconnect %d)", self.name, self.reconnects)

        def on_pause(error: BaseException, pause_s: float) -> None:
            log.warning("%s lost RabbitMQ (%s); reconnecting in %.0fs", self.name, one_line(error), pause_s)

        with contextlib.suppress(*RECOVERABLE):  # only once stopped: the run ends
            retrying.patiently(
                RECOVERABLE, stop_when_event_set(self.stop_event), self.stop_event.wait, on_pause
            )(connect)

    def _wake_connection(self) -> None:
        """Make the connection's thread return from pika now, to see the stop (any thread)."""
        connection = self._connection
        if connection is not None:
            # A closed connection needs no wake: its thread is already on its way out of pika.
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.add_callback_threadsafe(_nothing)

    def _wake_threads(self) -> None:
        """Wake the idle handler threads and the timer, to see that the service stops."""
        self._held.wake()
        for _ in range(self.concurrency):  # of no generation: a thread that takes one looks at the stop flag
            self._local.put(LocalItem(-1, 0, next(self._seq), -1, 0, Delivery("", b"", {}, False)))

    def _connect(self) -> None:
        connection = broker.connect(self.settings, f"{self.name} {self.settings.worker_id}")
        try:
            broker.declare_topology(connection, build_topology(self.settings))
        except BaseException:
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.close()
            raise
        channel = connection.channel()
        # Twice the handler threads per consumer: the local buffer refills while handlers work,
        # so a priority message is always waiting there before a bulk one is picked.
        channel.basic_qos(prefetch_count=2 * self.concurrency)
        self._publish_channel = broker.confirm_channel(connection)
        self._generation += 1
        self._unsettled.clear()
        self._connection, self._channel = connection, channel
        self._ack = pika_compat.batched_ack(channel, self._private_api)
        generation = self._generation
        for sub in self.subscriptions:
            channel.basic_consume(
                sub.queue,
                functools.partial(self._on_message, generation, sub.queue),
                arguments={"x-priority": sub.consumer_priority},
            )
        log.info("%s consuming %s", self.name, ", ".join(s.queue for s in self.subscriptions))

    def _on_message(
        self, generation: int, queue_name: str, _ch: Any, method: Any, properties: Any, body: bytes
    ) -> None:
        delivery = Delivery(
            queue=queue_name,
            body=body,
            headers=properties.headers or {},
            redelivered=bool(method.redelivered),
            priority=properties.priority or 0,
        )
        self._unsettled.add(method.delivery_tag)
        metrics.MESSAGES_CONSUMED.labels(queue_name).inc()
        rank, tag = self._rank[queue_name], method.delivery_tag
        item = LocalItem(rank, -delivery.priority, next(self._seq), generation, tag, delivery)
        parked = self._parked(delivery)
        if parked is not None:
            self._hold(dataclasses.replace(item, parked=True), parked)
        else:
            self._local.put(item)

    def _parked(self, delivery: Delivery) -> Outcome | None:
        if self.park is None:
            return None
        try:
            outcome = self.park(delivery)
        except Exception:  # the connection's thread must go on; the handler will see the message
            log.exception("%s could not tell whether to park a message from %s", self.name, delivery.queue)
            return None
        return outcome if outcome is not None and outcome.hold_s is not None else None

    def _drain(self) -> None:
        """Stop taking messages; let in-flight ones finish (bounded); unstarted ones go back."""
        for consumer_tag in list(self._channel.consumer_tags):
            self._channel.basic_cancel(consumer_tag)
        self._held.wake()  # held messages go back now, not when due
        # With nothing else in hand, what waits on other threads (rows for a commit) need not
        # wait for more; otherwise the last handler thread to finish calls it.
        self._call_if_quiet()
        deadline = time.monotonic() + min(self.settings.fetch_deadline_s + 5, MAX_DRAIN_S)
        while self._unsettled and (left_s := deadline - time.monotonic()) > 0:
            self._connection.process_data_events(time_limit=min(POLL_S, left_s))
            self._settle_waiting()
        if self._unsettled:
            log.warning(
                "%s stopping with %d unfinished messages; the broker will redeliver them",
                self.name,
                len(self._unsettled),
            )
        self._connection.close()
        self._connection = None

    def _forget_connection(self) -> None:
        self._generation += 1
        self._unsettled.clear()
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.close()


def run_consumers(
    settings: Settings,
    name: str,
    subscriptions: Sequence[Subscription],
    handler: Handler,
    concurrency: int,
    on_start: Callable[[], None] | None = None,
    stop_event: StopEvent | None = None,
    when_idle: Callable[[], None] | None = None,
    private_api: bool = True,
    park: Callable[[Delivery], Outcome | None] | None = None,
    when_quiet: Callable[[], None] | None = None,
) -> int:
    """Consume until SIGTERM/SIGINT (or `stop_event`), then stop cleanly; return the exit code.
    `private_api=False` acks through pika's public API only (shared/pika_compat.py)."""
    runtime = ConsumerRuntime(
        settings,
        name,
        subscriptions,
        handler,
        concurrency,
        stop_event,
        when_idle,
        private_api,
        park,
        when_quiet,
    )
    if threading.current_thread() is threading.main_thread():

        def request_stop(signum: int, _frame: object) -> None:
            log.info("%s got signal %d: finishing in-flight messages", name, signum)
            off_the_handler(runtime.stop_event.set)  # the Event's lock may be the main thread's

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    if on_start is not None:
        on_start()
    return runtime.run()


def _nothing() -> None:
    pass
