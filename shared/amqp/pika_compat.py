"""The two places we reach into pika's private parts, for speed, each checked before use and
each with a public fallback that sends the same frames, only less cheaply.

* `BatchWritingConnection` overrides `_adapter_emit_data`, the method a SelectConnection sends
  every frame through, to hold a batch's frames and write them as one piece, and to send frames
  marshalled by producer/publish_frames.py. Checked by version, and on first use: the frames
  that open the connection must have passed through the override. Fallback: every message
  goes out through the channel's public basic_publish, written as pika writes it.
* `batched_ack(channel)` acks on the BlockingChannel's underlying channel (`_impl`), which
  queues the frame for the connection's next poll instead of polling the socket until this one
  frame is written (a poll and a write per message). Checked by version and by the attribute's
  presence. Fallback: the BlockingChannel's public basic_ack.

Either path gives the broker the same acks and the same publishes; the tests run both
(tests/unit/test_publish_frames.py, tests/integration/test_pika_paths.py). A fallback is logged
once, at WARNING. `private_api=False` forces the fallback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pika

from shared.library_checks import outside, version_of, warn_fallback

# Both private parts are the same from 1.3.0 to 1.4.4, the newest release when this was written.
CHECKED_VERSIONS = ((1, 3), (1, 5))


def private_parts_checked(version: str | None = None) -> str | None:
    """Why pika's private parts may not be used, or None when they may."""
    return outside(version_of("pika") if version is None else version, *CHECKED_VERSIONS)


def batched_ack(channel: Any, private_api: bool = True) -> Callable[[int], None]:
    """A function that acks one delivery tag on `channel` (a BlockingChannel)."""
    why = "not wanted" if not private_api else private_parts_checked()
    underneath: Any = getattr(channel, "_impl", None)
    if why is None and not callable(getattr(underneath, "basic_ack", None)):
        why = "the blocking channel has no underlying channel to ack on"
    if why is None and getattr(underneath, "channel_number", None) != channel.channel_number:
        why = "the blocking channel's underlying channel is another channel"
    if why is None:
        ack: Callable[[int], None] = underneath.basic_ack
        return ack
    if private_api:
        warn_fallback("pika's batched acks", why, "BlockingChannel.basic_ack, one socket write per ack")
    public_ack: Callable[[int], None] = channel.basic_ack
    return public_ack


class BatchWritingConnection(pika.SelectConnection):  # type: ignore[misc]
    """A SelectConnection that can hold its output while a batch is published, then write it in
    one piece, and send frames marshalled elsewhere.

    pika writes every frame on its own (three a message: method, header, body) and its transport
    sends each with a syscall of its own, so 500 messages cost 1,500 small writes, as many TCP
    segments for RabbitMQ's reader to take apart, and 1,500 releases of the interpreter lock to
    the thread that reads sitemaps. Joined, they are one write. Only the I/O thread calls
    `_adapter_emit_data`.
    """

    def __init__(self, *args: Any, private_api: bool = True, **kwargs: Any) -> None:
        self._held: list[bytes] | None = None
        self._hooked_writes = 0
        why = "not wanted" if not private_api else private_parts_checked()
        if why is None and not hasattr(pika.SelectConnection, "_adapter_emit_data"):
            why = "SelectConnection has no _adapter_emit_data"
        self._why_unhooked = why
        self._private_api = private_api
        super().__init__(*args, **kwargs)

    @property
    def sends_own_frames(self) -> bool:
        """Frames may go out through `emit` and be held by `writes_joined`: pika's writes are
        known to pass through the override. Call `confirm_hooked` once the connection is open."""
        return self._why_unhooked is None

    def confirm_hooked(self) -> None:
        """The check on first use: opening the connection wrote frames; had none reached the
        override, pika writes some other way, and frames emitted here would be lost."""
        if self._why_unhooked is None and self._hooked_writes == 0:
            self._why_unhooked = "pika's writes did not pass through _adapter_emit_data"
        if self._why_unhooked is not None and self._private_api:
            warn_fallback(
                "the publisher's joined writes", self._why_unhooked, "pika's basic_publish, frame by frame"
            )

    def _adapter_emit_data(self, data: bytes) -> None:
        self._hooked_writes += 1
        if self._held is None:
            super()._adapter_emit_data(data)
        else:
            self._held.append(data)

    def emit(self, data: bytes) -> None:
        """Send frames marshalled elsewhere (producer/publish_frames.py), in order with pika's.
        Only when `sends_own_frames`."""
        if not self.sends_own_frames:
            raise RuntimeError("frames of our own cannot be sent on this pika")
        self._adapter_emit_data(data)

    @contextlib.contextmanager
    def writes_joined(self) -> Iterator[None]:
        """Inside, frames are held; on leaving, they are sent in their order as one write.
        Without the override, a plain block: pika writes as it goes."""
        if not self.sends_own_frames:
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held and not self.is_closed:
                super()._adapter_emit_data(b"".join(held))
