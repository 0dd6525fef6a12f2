"""How the consumer loop (shared/consumer/runtime.py) settles a message: the outcome its handler
returned is handed back to the connection's thread, which publishes what the outcome asks
(waiting for each confirm) and only then acks or rejects.

pika is not thread-safe, so the handler thread that decided an outcome never touches the
channel: it queues the outcome and wakes the connection's thread, and one wake settles every
outcome then waiting. Apart from the threads on either side because this is the one way a
message is acked or rejected: a crash anywhere before it leaves the message unacked, and the
broker delivers it again.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from shared.amqp import broker
from shared.consumer.deliveries import Outcome
from shared.consumer.local_buffer import LocalItem

# The loop's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("shared.consumer")  # the name operators know: kept as the module moved


class CurrentConnection:
    """The connection the loop consumes on now, as every part of the loop sees it: its channels,
    its ack, its generation (one more with each connect and each loss) and the delivery tags of
    this generation not yet settled. Only the connection's thread changes it; the other threads
    read `connection` and `generation`, each a single attribute read."""

    def __init__(self) -> None:
        self.connection: Any = None
        self.channel: Any = None
        self.publish_channel: Any = None
        self.ack: Callable[[int], None] = lambda _tag: None  # set with each channel
        self.generation = 0
        self.unsettled: set[int] = set()

    def use(self, connection: Any, channel: Any, publish_channel: Any, ack: Callable[[int], None]) -> int:
        """Consume on these from now on; returns their generation."""
        self.generation += 1
        self.unsettled.clear()
        self.connection, self.channel, self.publish_channel, self.ack = (
            connection,
            channel,
            publish_channel,
            ack,
        )
        return self.generation

    def forget(self) -> Any:
        """No connection from now on (lost, or stopping): returns the one there was, if any.
        Outcomes of its deliveries are dropped; the broker requeues them by itself."""
        self.generation += 1
        self.unsettled.clear()
        connection, self.connection = self.connection, None
        return connection


class Settling:
    """The one way a message is acked or rejected: outcomes handed back from any thread, settled
    on the connection's thread of `current`."""

    def __init__(self, name: str, current: CurrentConnection) -> None:
        self.name = name
        self.current = current
        # Outcomes handed back by handler threads, settled on the connection's thread. One wake
        # of that thread settles all that are waiting: a wake per outcome costs a pipe write and
        # a GIL handoff each. The loop also settles them after each (re)connect and every
        # POLL_S, so none can be stranded by a wake that went to a connection since replaced.
        self._settled: collections.deque[tuple[int, int, Outcome]] = collections.deque()
        self._settled_lock = threading.Lock()

    # ---- the thread that decided the outcome ------------------------------------------------

    def hand_back(self, item: LocalItem, outcome: Outcome) -> None:
        connection = self.current.connection
        if connection is None:
            return
        with self._settled_lock:
            first = not self._settled
            self._settled.append((item.generation, item.tag, outcome))
        if first:  # otherwise a wake is already on its way
            # If the connection closed meanwhile, the broker requeues the message by itself.
            with contextlib.suppress(*broker.CONNECTION_ERRORS):
                connection.add_callback_threadsafe(self.settle_waiting)

    # ---- the connection's thread ------------------------------------------------------------

    def settle_waiting(self) -> None:
        with self._settled_lock:
            waiting, self._settled = self._settled, collections.deque()
        for generation, tag, outcome in waiting:
            self._settle(generation, tag, outcome)

    def _settle(self, generation: int, tag: int, outcome: Outcome) -> None:
        current = self.current
        if generation != current.generation or tag not in current.unsettled:
            return  # from a closed channel: the broker has requeued it already
        try:
            for publication in outcome.publications:
                broker.publish(current.publish_channel, publication)
        except broker.PublishFailed as exc:
            log.warning("%s could not publish (%s); returning the message to its queue", self.name, exc)
            current.channel.basic_nack(tag, requeue=True)
        except broker.UNPUBLISHABLE as exc:
            # Our bug (e.g. a header AMQP cannot encode): dead-letter the original, do not crash-loop.
            log.error(
                "%s cannot encode an outgoing message (%s); dead-lettering the original", self.name, exc
            )
            current.channel.basic_reject(tag, requeue=False)
        else:
            if outcome.ack:
                # Where pika allows, queued: the acks of one wake go out together on the loop's
                # next poll, which follows at once (and a close sends queued frames first).
                current.ack(tag)
            else:
                current.channel.basic_reject(tag, requeue=outcome.requeue)
        current.unsettled.discard(tag)
