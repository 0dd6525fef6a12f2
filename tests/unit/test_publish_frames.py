"""The publisher's own frames are byte for byte what pika's basic_publish would send."""

from __future__ import annotations

from pika import frame, spec

from producer.publish_frames import PublishFrames
from shared.amqp.broker import Publication

CHANNEL = 1
FRAME_MAX = spec.FRAME_MAX_SIZE


def as_pika_sends_it(publication: Publication) -> bytes:
    """What pika's Connection._send_message writes for a mandatory basic_publish of a body that
    fits one frame."""
    publish = spec.Basic.Publish(
        exchange=publication.exchange, routing_key=publication.routing_key, mandatory=True
    )
    frames = [
        frame.Method(CHANNEL, publish).marshal(),
        frame.Header(CHANNEL, len(publication.body), publication.properties()).marshal(),
    ]
    if publication.body:
        frames.append(frame.Body(CHANNEL, publication.body).marshal())
    return b"".join(frames)


FIRST_ATTEMPT = {"crawl-attempt": 0, "crawl-replays": 0}
PUBLICATIONS = [
    Publication("ns.work", "new.bulk", b'{"url":"http://a.test/1"}', FIRST_ATTEMPT),
    Publication("ns.work", "new.bulk", b'{"url":"http://a.test/2"}', FIRST_ATTEMPT),
    Publication("ns.work", "new.priority", b'{"url":"http://a.test/3"}', {"crawl-attempt": 0}, priority=5),
    Publication("ns.work", "new.priority", b'{"url":"http://a.test/4"}', {"crawl-attempt": 0}, priority=3),
    Publication("ns.work", "new.ttl", b'{"url":"http://a.test/5"}'),
    Publication("ns.work", "new.ttl", b'{"url":"http://a.test/66"}', {"crawl-attempt": 1}),
    Publication("ns.retry", "d500.bulk", b"", {"crawl-error": "x" * 300}),
    Publication("other", "", b"\x00\xff" * 1000, {"nested": [1, "two"]}),  # not a cache key
]


def test_every_publication_is_sent_as_pika_would_send_it() -> None:
    frames = PublishFrames(CHANNEL, FRAME_MAX)
    for _ in range(2):  # the second time from the caches
        for publication in PUBLICATIONS:
            assert frames.encode(publication) == as_pika_sends_it(publication), publication


def test_a_body_larger_than_one_frame_is_left_to_pika() -> None:
    frames = PublishFrames(CHANNEL, frame_max=4096)
    assert frames.encode(Publication("ns.work", "new.bulk", b"x" * (4096 - 8))) is not None
    assert frames.encode(Publication("ns.work", "new.bulk", b"x" * (4096 - 7))) is None


def test_the_caches_stay_bounded() -> None:
    frames = PublishFrames(CHANNEL, FRAME_MAX)
    for size in range(10_000):
        publication = Publication("ns.work", f"new.{size}", b"x" * size)
        assert frames.encode(publication) == as_pika_sends_it(publication)
    assert len(frames._methods) <= 4096 and len(frames._headers) <= 4096
