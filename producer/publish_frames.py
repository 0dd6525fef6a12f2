"""The bytes of a Basic.Publish, with what repeats marshalled by pika once and reused.

pika builds three frames for every message it publishes: the Basic.Publish method, the content
header (the properties) and the body. Marshalling them in pure Python cost the producer's I/O
thread about 12 µs a message, the biggest part of its work. Yet across a run the first two
hardly vary: the method frame depends only on the exchange and routing key, the header only on
the body's length and the properties, which are the same for every task of a queue. So both
are marshalled by pika's own frame classes the first time they are needed, and reused; the body
frame is packed directly. A unit test holds the result to what pika itself would send.
"""

from __future__ import annotations

import struct

from pika import frame, spec

from shared.amqp.broker import Publication

# A body frame: type, channel, payload size, the payload, the frame-end octet; packed here as
# pika's Frame._marshal packs it, without its per-frame objects.
_FRAME_START = struct.Struct(">BHI")
_FRAME_END = bytes([spec.FRAME_END])

# Distinct routes or (body length, priority, headers) kept; bodies of URLs up to 2,048
# characters give a few thousand shapes at most. Past this a cache starts afresh rather than
# grow without bound.
MAX_CACHED_FRAMES = 4096


class PublishFrames:
    """Frames for mandatory, persistent publishes on one channel."""

    def __init__(self, channel_number: int, frame_max: int) -> None:
        self._channel_number = channel_number
        self._max_body_bytes = frame_max - spec.FRAME_HEADER_SIZE - spec.FRAME_END_SIZE
        self._methods: dict[tuple[str, str], bytes] = {}
        self._headers: dict[tuple[object, ...], bytes] = {}

    def encode(self, publication: Publication) -> bytes | None:
        """The frames of `publication` as one piece, or None when its body needs more than one
        body frame: pika's own basic_publish splits those."""
        body = publication.body
        if len(body) > self._max_body_bytes:
            return None
        frames = [self._method(publication), self._header(publication)]
        if body:  # as pika does, an empty body has no body frame
            frames += (_FRAME_START.pack(spec.FRAME_BODY, self._channel_number, len(body)), body, _FRAME_END)
        return b"".join(frames)

    def _method(self, publication: Publication) -> bytes:
        route = (publication.exchange, publication.routing_key)
        method = self._methods.get(route)
        if method is None:
            if len(self._methods) >= MAX_CACHED_FRAMES:
                self._methods.clear()
            publish = spec.Basic.Publish(exchange=route[0], routing_key=route[1], mandatory=True)
            method = self._methods[route] = frame.Method(self._channel_number, publish).marshal()
        return method

    def _header(self, publication: Publication) -> bytes:
        shape = (len(publication.body), publication.priority, *publication.headers.items())
        try:
            header = self._headers.get(shape)
        except TypeError:  # a header value that cannot be a key (a list): marshalled every time
            return self._marshal_header(publication)
        if header is None:
            if len(self._headers) >= MAX_CACHED_FRAMES:
                self._headers.clear()
            header = self._headers[shape] = self._marshal_header(publication)
        return header

    def _marshal_header(self, publication: Publication) -> bytes:
        properties = publication.properties()
        header: bytes = frame.Header(self._channel_number, len(publication.body), properties).marshal()
        return header
