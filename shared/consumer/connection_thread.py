"""What the connection's thread of the consumer loop (shared/consumer/runtime.py) does: connect and
declare the topology, take each delivery from pika into the local buffer (or park it in the
timer heap), stay inside pika while it waits, connect again after a loss, and drain when the
service stops.

pika is not thread-safe and a BlockingConnection does its I/O (heartbeats included) only inside
pika calls, so this thread never runs handlers and is the only one that touches the connection
and its channels; the others reach it through `add_callback_threadsafe`. Apart from the
handler threads (shared/consumer/handler_threads.py) and the settling of outcomes
(shared/consumer/settling.py) because this is the loop's dealing with the broker as a
connection: its life, its losses and its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import stop_when_event_set

from shared import metrics, retrying
from shared.amqp import broker, pika_compat
from shared.amqp.topology import build_topology
from shared.consumer.deliveries import Delivery, Outcome, StopEvent, Subscription
from shared.consumer.handler_threads import HandlerThreads
from shared.consumer.local_buffer import LocalItem
from shared.consumer.settling import CurrentConnection, Settling
from shared.errors import ServiceUnavailable, one_line
from shared.settings import Settings

# The loop's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("shared.consumer")  # the name operators know: kept as the module moved

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


Open = Callable[[Settings, str, int], tuple[Any, Any, Any]]


def open_on_broker(settings: Settings, client_name: str, prefetch: int) -> tuple[Any, Any, Any]:
    """A connection to RabbitMQ with the topology declared, a channel to consume on with
    `prefetch`, and a confirming channel to publish on: what the loop's `connect=` returns."""
    connection = broker.connect(settings, client_name)
    try:
        broker.declare_topology(connection, build_topology(settings))
    except BaseException:
        with contextlib.suppress(*broker.CONNECTION_ERRORS):
            connection.close()
        raise
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    return connection, channel, broker.confirm_channel(connection)


class ConnectionThread:
    """The connection's side of the loop: consumes `subscriptions` on what `connect` opens,
    puts each message it takes in `threads`' local buffer (or holds it there, when `park` says
    so), and settles outcomes through `settling` between its waits inside pika."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        subscriptions: Sequence[Subscription],
        threads: HandlerThreads,
        settling: Settling,
        current: CurrentConnection,
        stop_event: StopEvent,
        park: Callable[[Delivery], Outcome | None] | None = None,
        connect: Open = open_on_broker,
        private_api: bool = True,
    ) -> None:
        self.settings = settings
        self.name = name
        self.subscriptions = list(subscriptions)
        self.threads = threads
        self.settling = settling
        self.current = current
        self.stop_event = stop_event
        self.park = park
        self.connect = connect
        # False: acks through pika's public API only (shared/amqp/pika_compat.py); the same acks, slower.
        self.private_api = private_api
        self.reconnects = 0
        # Higher consumer priority = served first from the local buffer too.
        ranks = sorted({s.consumer_priority for s in subscriptions}, reverse=True)
        self._rank = {s.queue: ranks.index(s.consumer_priority) for s in subscriptions}

    def consume(self) -> None:
        """Until the stop, through losses of the connection; then drain."""
        if not self.stop_event.is_set():
            try:
                self._connect()
            except RECOVERABLE as exc:  # never connected: a setting is wrong, or the broker is not up
                self.stop_event.set()
                raise (
                    exc if isinstance(exc, ServiceUnavailable) else broker.unavailable(self.settings, exc)
                ) from None
        while self.current.connection is not None:  # None once lost and the stop came before a reconnect
            try:
                while not self.stop_event.is_set():
                    self.threads.decide_returned()
                    self.settling.settle_waiting()
                    self.current.connection.process_data_events(time_limit=POLL_S)
                self._drain()
                break
            except RECOVERABLE as exc:
                self.forget_connection()
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

    def wake(self) -> None:
        """Make the connection's thread return from pika now, to see the stop (any thread)."""
        connection = self.current.connection
        if connection is not None:
            # A closed connection needs no wake: its thread is already on its way out of pika.
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.add_callback_threadsafe(_nothing)

    def _connect(self) -> None:
        # Twice the handler threads per consumer: the local buffer refills while handlers work,
        # so a priority message is always waiting there before a bulk one is picked.
        connection, channel, publish_channel = self.connect(
            self.settings, f"{self.name} {self.settings.worker_id}", 2 * self.threads.concurrency
        )
        ack = pika_compat.batched_ack(channel, self.private_api)
        generation = self.current.use(connection, channel, publish_channel, ack)
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
        self.current.unsettled.add(method.delivery_tag)
        metrics.MESSAGES_CONSUMED.labels(queue_name).inc()
        rank, tag = self._rank[queue_name], method.delivery_tag
        item = LocalItem(rank, -delivery.priority, next(self.threads.seq), generation, tag, delivery)
        parked = self._parked(delivery)
        if parked is not None:
            self.threads.hold(dataclasses.replace(item, parked=True), parked)
        else:
            self.threads.local.put(item)

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
        current = self.current
        for consumer_tag in list(current.channel.consumer_tags):
            current.channel.basic_cancel(consumer_tag)
        self.threads.held.wake()  # held messages go back now, not when due
        # With nothing else in hand, what waits on other threads (rows for a commit) need not
        # wait for more; otherwise the last handler thread to finish calls it.
        self.threads.call_if_quiet()
        deadline = time.monotonic() + min(self.settings.fetch_deadline_s + 5, MAX_DRAIN_S)
        while current.unsettled and (left_s := deadline - time.monotonic()) > 0:
            current.connection.process_data_events(time_limit=min(POLL_S, left_s))
            self.threads.decide_returned()
            self.settling.settle_waiting()
        if current.unsettled:
            log.warning(
                "%s stopping with %d unfinished messages; the broker will redeliver them",
                self.name,
                len(current.unsettled),
            )
        current.connection.close()
        current.connection = None

    def forget_connection(self) -> None:
        connection = self.current.forget()
        if connection is not None and connection.is_open:
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.close()


def _nothing() -> None:
    pass
