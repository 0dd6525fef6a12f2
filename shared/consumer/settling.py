"""How the consumer loop (shared/consumer/runtime.py) settles a message: the outcome its handler
returned is handed back to the connection's thread, which publishes what the outcome asks
(waiting for each confirm) and only then acks or rejects.

Publications that may be joined (broker.Joining), each the only one of an outcome that acks,
go out joined with the others settled in the same wake: one publish and one confirm, and then
an ack for each of their messages (or, if it fails, all of them back to their queue).

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
from collections.abc import Callable, Iterator, Sequence
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
        """An outcome decided on a handler thread, to be settled in the connection's next wake."""
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

    def settle_now(self, decided: Sequence[tuple[LocalItem, Outcome]]) -> None:
        """Outcomes decided on the connection's thread, settled at once with every other one
        waiting (and joined with them where they may be)."""
        with self._settled_lock:
            self._settled.extend((item.generation, item.tag, outcome) for item, outcome in decided)
        self.settle_waiting()

    def settle_waiting(self) -> None:
        with self._settled_lock:
            waiting, self._settled = self._settled, collections.deque()
        joinable: dict[tuple[Any, ...], list[tuple[int, broker.Publication]]] = {}
        for generation, tag, outcome in waiting:
            if self._stale(generation, tag):
                continue
            publication = _joinable(outcome)
            if publication is None:
                self._publish_then_settle([tag], outcome.publications, outcome)
            else:
                key = (publication.exchange, publication.routing_key, publication.joins, publication.priority)
                joinable.setdefault(key, []).append((tag, publication))
        for group in joinable.values():
            for tags, publication in _joined(group):
                self._publish_then_settle(tags, (publication,), _JOINED)

    def _stale(self, generation: int, tag: int) -> bool:
        # From a closed channel: the broker has requeued it already.
        return generation != self.current.generation or tag not in self.current.unsettled

    def _publish_then_settle(
        self, tags: list[int], publications: tuple[broker.Publication, ...], outcome: Outcome
    ) -> None:
        """Publish, then settle the messages of `tags` as `outcome` says; all of them go back to
        their queue if a publication fails, since each needs it on its way."""
        current = self.current
        try:
            for publication in publications:
                broker.publish(current.publish_channel, publication)
        except broker.PublishFailed as exc:
            log.warning("%s could not publish (%s); returning the message to its queue", self.name, exc)
            for tag in tags:
                current.channel.basic_nack(tag, requeue=True)
        except broker.UNPUBLISHABLE as exc:
            # Our bug (e.g. a header AMQP cannot encode): dead-letter the original, do not crash-loop.
            log.error(
                "%s cannot encode an outgoing message (%s); dead-lettering the original", self.name, exc
            )
            for tag in tags:
                current.channel.basic_reject(tag, requeue=False)
        else:
            for tag in tags:
                if outcome.ack:
                    # Where pika allows, queued: the acks of one wake go out together on the loop's
                    # next poll, which follows at once (and a close sends queued frames first).
                    current.ack(tag)
                else:
                    current.channel.basic_reject(tag, requeue=outcome.requeue)
        current.unsettled.difference_update(tags)


_JOINED = Outcome.done()  # what settles each message of a joined publication, once it is confirmed


def _joinable(outcome: Outcome) -> broker.Publication | None:
    """The outcome's one publication, if it may be joined with others (broker.Joining) and the
    message is acked once it is confirmed."""
    if len(outcome.publications) != 1 or not outcome.ack:
        return None
    publication = outcome.publications[0]
    plain = not publication.headers and publication.if_unroutable is None
    return publication if publication.joins is not None and plain else None


def _joined(
    group: list[tuple[int, broker.Publication]],
) -> Iterator[tuple[list[int], broker.Publication]]:
    """The publications of one Joining, exchange, routing key and priority, joined as many at a
    time as fit its bounds, each with the tags of the messages it settles; one that fits with no
    other goes as it is."""
    joins = group[0][1].joins
    assert joins is not None
    start = 0
    while start < len(group):
        end, size = start + 1, len(group[start][1].body)
        while end < len(group) and end - start < joins.max_count:
            size += len(group[end][1].body) + 1  # and a separator, say
            if size > joins.max_bytes:
                break
            end += 1
        tags = [tag for tag, _ in group[start:end]]
        first = group[start][1]
        if end - start == 1:
            yield tags, first
        else:
            body = joins.join([publication.body for _, publication in group[start:end]])
            yield tags, broker.Publication(first.exchange, first.routing_key, body, priority=first.priority)
        start = end
