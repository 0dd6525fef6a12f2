"""The one consumer loop every service uses: receive → handle on a thread → settle on the connection's thread.

pika is not thread-safe and a BlockingConnection does its I/O (heartbeats included) only inside
pika calls, so the connection's thread never runs handlers: it sits in `process_data_events`
and handlers run on `concurrency` threads. A handler returns an Outcome; the thread hands it
back with `add_callback_threadsafe`, and the connection's thread publishes what the outcome asks
(waiting for each confirm) and only then acks. A crash anywhere before the ack leaves the
message unacked, and the broker delivers it again.

A handler that cannot finish a message yet returns `Outcome.hold(seconds, memo)`: the message
stays unacked in a timer heap (shared/consumer/holds.py) and goes back to a handler thread when due, with
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

ConsumerRuntime, here with its state and its run, is built of parts that each keep to one side
of the loop: the connection's thread (shared/consumer/connection_thread.py), the handler threads and the
timer thread (shared/consumer/handler_threads.py), and the settling of outcomes (shared/consumer/settling.py),
over the local buffer (shared/consumer/local_buffer.py) and the values a service deals in
(shared/consumer/deliveries.py, imported from here). The parts are base classes, not objects of their
own, so a delivery passes from one to the next with no call or object added: this is every
worker's hot path.
"""

from __future__ import annotations

import collections
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from shared.consumer.connection_thread import ConnectionThread
from shared.consumer.deliveries import Delivery, Handler, Outcome, StopEvent, Subscription
from shared.consumer.holds import HeldMessages
from shared.consumer.local_buffer import LocalItem, LocalQueue
from shared.settings import Settings
from shared.signals import off_the_handler

log = logging.getLogger("shared.consumer")  # the name operators know: kept as the module moved


class ConsumerRuntime(ConnectionThread):
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
        # False: acks through pika's public API only (shared/amqp/pika_compat.py); the same acks, slower.
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

    def _wake_threads(self) -> None:
        """Wake the idle handler threads and the timer, to see that the service stops."""
        self._held.wake()
        for _ in range(self.concurrency):  # of no generation: a thread that takes one looks at the stop flag
            self._local.put(LocalItem(-1, 0, next(self._seq), -1, 0, Delivery("", b"", {}, False)))


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
    `private_api=False` acks through pika's public API only (shared/amqp/pika_compat.py)."""
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
