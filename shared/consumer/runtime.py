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
returns `Outcome.back_when(report, memo)`: its thread goes on to the next message at once, and
once `report` is done the message comes back to the handler, with `memo`, on the connection's
thread, to decide its outcome from the report (a decision that never waits) and be settled in
the same wake; the other thread only reports. Until then the message stays unacked, and counts
against the prefetch like any other. `when_quiet` is called on the
handler thread that finds the service with nothing else in hand (no message waiting or held,
no other thread handling one): what waits on another thread then waits for nothing (the worker
commits its batch at once).

Deliveries carry the generation of the connection they came on. After a reconnect the broker
has already requeued everything unacked, so outcomes from an older generation are dropped.

ConsumerRuntime composes the loop of three objects, each of one side and each buildable alone:
the connection's thread (shared/consumer/connection_thread.py), the handler threads and the
timer thread (shared/consumer/handler_threads.py), and the settling of outcomes
(shared/consumer/settling.py), which all see the connection in use through one
CurrentConnection. A delivery crosses them as a LocalItem (shared/consumer/local_buffer.py: the
message, and the generation and tag it is settled by); what a service hands the loop and gets
back are the values of shared/consumer/deliveries.py. `connect=` opens the connection (the seam
tests use: a fake connection and channels, no broker).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence

from shared.consumer.connection_thread import ConnectionThread, Open, open_on_broker
from shared.consumer.deliveries import ConsumerHooks, Handler, StopEvent, Subscription
from shared.consumer.handler_threads import HandlerThreads
from shared.consumer.settling import CurrentConnection, Settling
from shared.settings import Settings
from shared.signals import off_the_handler

log = logging.getLogger("shared.consumer")  # the name operators know: kept as the module moved
NO_HOOKS = ConsumerHooks()


class ConsumerRuntime:
    def __init__(
        self,
        settings: Settings,
        name: str,
        subscriptions: Sequence[Subscription],
        handler: Handler,
        concurrency: int,
        stop_event: StopEvent | None = None,
        hooks: ConsumerHooks = NO_HOOKS,
        private_api: bool = True,
        connect: Open = open_on_broker,
    ) -> None:
        self.settings = settings
        self.name = name
        self.hooks = hooks
        self.stop_event = stop_event or StopEvent()
        self.current = CurrentConnection()
        self.settling = Settling(name, self.current)
        self.threads = HandlerThreads(
            name, handler, concurrency, self.stop_event, hooks, self.current, self.settling
        )
        self.connection = ConnectionThread(
            settings,
            name,
            subscriptions,
            self.threads,
            self.settling,
            self.current,
            self.stop_event,
            hooks.park,
            connect,
            private_api,
        )
        self.stop_event.when_set(self.connection.wake)

    @property
    def reconnects(self) -> int:
        return self.connection.reconnects

    def run(self) -> int:
        self.threads.start()
        try:
            self.connection.consume()
        finally:
            # The threads sleep until woken, with no timeout: however the run ends, wake them.
            self.connection.forget_connection()
            self.threads.wake()
        self.threads.join(self.settings.fetch_deadline_s + 5)
        return 0


def run_consumers(
    settings: Settings,
    name: str,
    subscriptions: Sequence[Subscription],
    handler: Handler,
    concurrency: int,
    hooks: ConsumerHooks = NO_HOOKS,
    stop_event: StopEvent | None = None,
    private_api: bool = True,
) -> int:
    """Consume until SIGTERM/SIGINT (or `stop_event`), then stop cleanly; return the exit code.
    `private_api=False` acks through pika's public API only (shared/amqp/pika_compat.py)."""
    runtime = ConsumerRuntime(
        settings, name, subscriptions, handler, concurrency, stop_event, hooks, private_api
    )
    if threading.current_thread() is threading.main_thread():

        def request_stop(signum: int, _frame: object) -> None:
            log.info("%s got signal %d: finishing in-flight messages", name, signum)
            off_the_handler(runtime.stop_event.set)  # the Event's lock may be the main thread's

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    if hooks.on_start is not None:
        hooks.on_start()
    return runtime.run()
