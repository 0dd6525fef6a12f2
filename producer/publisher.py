"""Publishing with pipelined confirms: thousands of messages in flight, not one round trip each.

A blocking channel in confirm mode waits for each message's confirm (about 1,900 msg/s here).
Instead, one asynchronous connection (pika SelectConnection) runs its I/O loop in a thread of
its own; the caller hands it a whole batch and waits once for the batch's confirms. The broker
acks or nacks by delivery tag, often many at once (`multiple`), and each message's outcome is
written back to its batch. pika is not thread-safe: the caller's thread touches the connection
only through `add_callback_threadsafe`; everything else happens on the I/O thread.

A message comes back as failed (False) when the broker nacks it, returns it as unroutable
(mandatory publishing), the connection drops before its confirm, or no confirm arrives within
`confirm_timeout_s`. A failed message may still have reached a queue (a confirm lost with the
connection), so a retry can duplicate it: workers take that in their stride.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
import pika.spec

from producer.publish_frames import PublishFrames
from shared.amqp.broker import (
    LOST_BEFORE_HANDSHAKE,
    NodeOrder,
    Publication,
    connection_parameters,
    unavailable,
)
from shared.amqp.pika_compat import BatchWritingConnection
from shared.settings import Settings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
CONFIRM_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 10.0
WAIT_SLICE_S = 0.25  # how often a waiting caller checks that the connection is still there


class PendingBatch:
    """One submitted batch; `wait()` returns its outcomes, True = confirmed."""

    def __init__(self, size: int, link: _Link | None = None, timeout_s: float = CONFIRM_TIMEOUT_S) -> None:
        self.results: list[bool | None] = [None] * size
        self._unresolved = size
        self._done = threading.Event()
        self._link = link
        self._timeout_s = timeout_s
        if size == 0:
            self._done.set()

    def done(self) -> bool:
        """Every outcome is in: `wait()` returns at once."""
        return self._done.is_set()

    def resolve(self, index: int, ok: bool) -> None:
        """Record one outcome; only the I/O thread calls this."""
        if self.results[index] is None:
            self.results[index] = ok
            self._unresolved -= 1
            if self._unresolved == 0:
                self._done.set()

    def fail_unresolved(self) -> None:
        for index, outcome in enumerate(self.results):
            if outcome is None:
                self.resolve(index, False)

    def wait(self) -> list[bool]:
        deadline = time.monotonic() + self._timeout_s
        while not self._done.wait(WAIT_SLICE_S) and self._link is not None:
            if not self._link.running:
                # The connection and its I/O thread are gone, perhaps before this batch was even
                # sent: nothing will resolve it now, and nothing else touches it, so fail the rest
                # here rather than wait out the confirm timeout.
                self.fail_unresolved()
            elif time.monotonic() >= deadline:
                log.warning("no confirm for %d messages in %.0f s", self._unresolved, self._timeout_s)
                self._link.call_soon(self.fail_unresolved)  # resolved on the I/O thread, no race
                self._done.wait(CLOSE_TIMEOUT_S)
                break
        # Reading after the event is safe; if the I/O thread is wedged, unresolved = failed.
        return [outcome is True for outcome in list(self.results)]


class ConfirmingPublisher:
    """Publishes batches of Publications over one connection, reconnecting when it was lost."""

    def __init__(
        self,
        settings: Settings,
        name: str = "producer",
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
        private_api: bool = True,
        node_order: NodeOrder = random.shuffle,
    ) -> None:
        self._settings = settings
        self._name = name
        self._confirm_timeout_s = confirm_timeout_s
        # False: pika's public publishing only (shared/amqp/pika_compat.py); the same messages, slower.
        self._private_api = private_api
        self._node_order = node_order
        self._link: _Link | None = None

    def start(self) -> None:
        """Connect now (raises ServiceUnavailable), rather than on the first batch."""
        self._ensure_link()

    def submit(self, publications: Sequence[Publication]) -> PendingBatch:
        """Send a batch without waiting; several batches may be in flight at once."""
        link = self._ensure_link()
        batch = PendingBatch(len(publications), link, self._confirm_timeout_s)
        if publications:
            link.call_soon(functools.partial(link.publish_all, list(publications), batch))
        return batch

    def publish_batch(self, publications: Sequence[Publication]) -> list[bool]:
        """Publish and wait for every confirm; one outcome per publication, True = confirmed."""
        return self.submit(publications).wait()

    @property
    def sends_own_frames(self) -> bool:
        """Whether the open connection publishes with frames of our own, joined in one write a
        batch (pika's private hook, shared/amqp/pika_compat.py), rather than with basic_publish."""
        return self._link is not None and self._link.sends_own_frames

    def close(self) -> None:
        if self._link is not None:
            self._link.stop()
            self._link = None

    def __enter__(self) -> ConfirmingPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ensure_link(self) -> _Link:
        if self._link is not None and not self._link.usable:
            if self._link.close_reason:  # it was open, then lost; a link that never opened says nothing
                log.warning("publisher connection lost (%s): reconnecting", self._link.close_reason)
            self._link.stop()
            self._link = None
        if self._link is None:
            self._link = _Link(self._settings, self._name, self._node_order, self._private_api)
            self._link.start()
        return self._link


class _Link:
    """One SelectConnection, its confirm-mode channel and its I/O thread."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        node_order: NodeOrder,
        private_api: bool = True,
        open_connection: Callable[..., Any] = BatchWritingConnection,
    ) -> None:
        """`open_connection`: builds the SelectConnection (the seam tests use)."""
        self._settings = settings
        self._private_api = private_api
        self._open_connection = open_connection
        # Every node AMQP_URL names, shuffled: the first that answers carries the link.
        self._candidates = connection_parameters(settings, name, node_order)
        self._connection: Any = None
        self._channel: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-amqp", daemon=True)
        self._open_error: BaseException | None = None
        self._opened = False
        self.close_reason: str = ""
        self.usable = False
        # Owned by the I/O thread: delivery tag -> (batch, index in batch, what was published).
        self._pending: dict[int, tuple[PendingBatch, int, Publication]] = {}
        self._returned: set[int] = set()
        self._frames: PublishFrames | None = None
        self._next_tag = 1
        self._oldest_tag = 1

    # -- caller's thread ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(CONNECT_TIMEOUT_S):
            self.stop()
            raise unavailable(self._settings, TimeoutError("connect timed out"))
        if not self.usable:
            self.stop()
            error = self._open_error or ConnectionError(self.close_reason or "connection refused")
            raise unavailable(self._settings, error)

    @property
    def sends_own_frames(self) -> bool:
        return self.usable and bool(self._connection.sends_own_frames)

    @property
    def running(self) -> bool:
        """The I/O thread is alive: it may still resolve what it was given."""
        return self._thread.is_alive()

    def call_soon(self, callback: Any) -> None:
        """Run `callback` on the I/O thread (the one pika call that is thread-safe)."""
        try:
            self._connection.ioloop.add_callback_threadsafe(callback)
        except (AttributeError, RuntimeError):  # the loop is gone: nothing will resolve now
            log.debug("I/O loop closed; callback dropped")

    def stop(self) -> None:
        if self._thread.is_alive():
            self.call_soon(self._close_connection)
            self._thread.join(CLOSE_TIMEOUT_S)

    # -- I/O thread -----------------------------------------------------------------------

    def _run(self) -> None:
        for params in self._candidates:
            self._open_error = None
            if self._run_one(params) or self._open_error is None:
                break  # it opened (and has since closed), or failed in a way another node won't fix
        self.usable = False
        self._ready.set()

    def _run_one(self, params: pika.URLParameters) -> bool:
        """Connect to one node and run the I/O loop until the connection ends; True if it opened."""
        try:
            self._connection = self._open_connection(
                params,
                private_api=self._private_api,
                on_open_callback=self._on_connection_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_connection_closed,
            )
        except (pika.exceptions.AMQPError, OSError, ValueError) as exc:
            self._open_error = exc
            return False
        try:
            self._connection.ioloop.start()
        except ValueError as exc:
            # pika's check of a TCP connection just made (shared/amqp/broker.py's
            # LOST_BEFORE_HANDSHAKE), here inside the loop: a reset before the handshake is a
            # node that did not answer, not a dead I/O thread and a traceback.
            if LOST_BEFORE_HANDSHAKE not in str(exc):
                raise
            self._open_error = exc
        finally:
            self.usable = False
            self._fail_all_pending()
            self._connection.ioloop.close()  # frees the loop's wake-up sockets
        return self._opened

    def _on_connection_open(self, connection: Any) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: Any, error: BaseException) -> None:
        # pika wraps the socket's error (e.g. connection refused) two layers deep, in a workflow
        # error that says nothing by itself: keep the last attempt's own error for the message.
        workflow = next((a for a in error.args if isinstance(a, BaseException)), error)
        attempts = getattr(workflow, "exceptions", None) or [error]
        self._open_error = getattr(attempts[-1], "exception", None) or attempts[-1]
        connection.ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        self._frames = PublishFrames(channel.channel_number, self._connection.params.frame_max)
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_mode)

    def _on_confirm_mode(self, _frame: Any) -> None:
        self._connection.confirm_hooked()
        self._opened = True
        self.usable = True
        self._ready.set()

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        # The channel is gone (e.g. the broker refused a publish): drop the connection too, so
        # outstanding messages fail now and the next batch reconnects cleanly.
        self.usable = False
        self.close_reason = self.close_reason or f"channel closed: {reason}"
        self._close_connection()

    def _on_connection_closed(self, connection: Any, reason: BaseException) -> None:
        self.usable = False
        self.close_reason = self.close_reason or str(reason)
        self._fail_all_pending()
        connection.ioloop.stop()

    def _close_connection(self) -> None:
        self.usable = False
        if self._connection is not None and not (self._connection.is_closing or self._connection.is_closed):
            self._connection.close()

    def publish_all(self, publications: list[Publication], batch: PendingBatch) -> None:
        with self._connection.writes_joined():
            self._publish_each(publications, batch)

    def _publish_each(self, publications: list[Publication], batch: PendingBatch) -> None:
        for index, publication in enumerate(publications):
            if not self.usable:
                batch.resolve(index, False)
                continue
            try:
                self._publish(publication)
            except (pika.exceptions.AMQPError, OSError) as exc:
                # Delivery tags may no longer line up with the broker's count: start afresh.
                log.warning("publish failed: %s", exc)
                self._close_connection()
                batch.resolve(index, False)
                continue
            self._pending[self._next_tag] = (batch, index, publication)
            self._next_tag += 1

    def _publish(self, publication: Publication) -> None:
        """Mandatory and persistent: the same bytes as pika's basic_publish, at a fraction of the
        cost (producer/publish_frames.py) where frames of our own can be sent."""
        assert self._frames is not None  # set with the channel, before the link is usable
        frames = self._frames.encode(publication) if self._connection.sends_own_frames else None
        if frames is None:
            self._channel.basic_publish(
                publication.exchange,
                publication.routing_key,
                publication.body,
                publication.properties(),
                mandatory=True,
            )
        elif self._channel.is_open:
            self._connection.emit(frames)
        else:
            raise pika.exceptions.ChannelWrongStateError("channel is closed")

    def _on_return(self, _channel: Any, method: Any, _properties: Any, body: bytes) -> None:
        log.warning(
            "broker returned a message: %s %s (routing key %s)",
            method.reply_code,
            method.reply_text,
            method.routing_key,
        )
        # The broker sends an unroutable message back before it acks it, but without its
        # delivery tag: find it among the messages waiting by what it carries. Were several
        # alike, all fail, routed or not: a retry may then duplicate one, but none is lost.
        returned = (method.exchange, method.routing_key, body)
        for tag, (_batch, _index, publication) in self._pending.items():
            if (publication.exchange, publication.routing_key, publication.body) == returned:
                self._returned.add(tag)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        acked = isinstance(method, pika.spec.Basic.Ack)
        last = method.delivery_tag
        tags = range(self._oldest_tag, last + 1) if method.multiple else (last,)
        for tag in tags:
            entry = self._pending.pop(tag, None)
            if entry is not None:
                batch, index, _publication = entry
                batch.resolve(index, acked and tag not in self._returned)
                self._returned.discard(tag)
        while self._oldest_tag < self._next_tag and self._oldest_tag not in self._pending:
            self._oldest_tag += 1

    def _fail_all_pending(self) -> None:
        pending, self._pending = self._pending, {}
        self._returned.clear()
        for batch, index, _publication in pending.values():
            batch.resolve(index, False)
