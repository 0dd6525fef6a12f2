"""Message encode/decode, and headers that AMQP can actually carry."""

from __future__ import annotations

import dataclasses
import json

import pika
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from shared.errors import DecodeError
from shared.messages import CrawlTask, Failure, Progress, TaskBodies


def test_task_round_trips() -> None:
    task = CrawlTask(
        url="http://a.test/p",
        run_id="r",
        queue="ttl",
        priority=3,
        lastmod="2024-01-01",
        changefreq="daily",
        sitemap_priority=0.9,
        source="http://a.test/sitemap.xml",
    )
    assert CrawlTask.decode(task.encode()) == task


texts = st.text(max_size=40)  # any characters: quotes, control characters, non-ASCII, surrogates
numbers = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.floats(0.0, 1.0))


tasks = st.builds(
    CrawlTask,
    url=texts,
    run_id=texts,
    queue=texts,
    priority=numbers,
    lastmod=st.one_of(st.none(), texts),
    changefreq=st.one_of(st.none(), texts),
    sitemap_priority=numbers,
    source=texts,
    enqueued_at=numbers,
    recrawl_of=st.one_of(st.none(), texts, st.integers()),  # not even a string
)


@hypothesis_settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(tasks)
def test_a_task_encodes_as_json_dumps_of_its_fields(task: CrawlTask) -> None:
    """encode() spells the JSON out by hand; it must give json.dumps's bytes, whatever the values."""
    assert task.encode() == json.dumps(dataclasses.asdict(task), separators=(",", ":")).encode()


@hypothesis_settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(st.lists(tasks, min_size=1, max_size=6), st.booleans())
def test_one_encoder_for_a_batch_gives_each_task_its_own_bytes(
    batch: list[CrawlTask], same_source: bool
) -> None:
    """The producer spells a batch's shared fields once and a source once for the URLs in a
    row that share it; every body must still be its own task's."""
    first = batch[0]
    source = first.source
    batch = [
        dataclasses.replace(
            task,
            run_id=first.run_id,
            enqueued_at=first.enqueued_at,
            recrawl_of=first.recrawl_of,
            source=source if same_source else task.source,
        )
        for task in batch
    ]
    bodies = TaskBodies(first.run_id, first.enqueued_at, first.recrawl_of)
    for task in batch:
        body = bodies.body(
            task.url,
            task.queue,
            task.priority,
            task.lastmod,
            task.changefreq,
            task.sitemap_priority,
            task.source,
        )
        assert body == json.dumps(dataclasses.asdict(task), separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("body", "reason", "fragment"),
    [
        (b"\xff\xfe", "undecodable", "not JSON"),
        (b"[1, 2]", "undecodable", "not a JSON object"),
        (b"[" * 30_000, "undecodable", "not JSON"),
        (b'{"run_id": "r", "queue": "bulk"}', "invalid_message", "'url'"),
        (
            b'{"url": "http://a.test/", "run_id": "r", "queue": "elsewhere"}',
            "invalid_message",
            "unknown queue",
        ),
        (
            b'{"url": "http://a.test/", "run_id": "r", "queue": "bulk", "priority": 1, "lastmod": null, '
            b'"x": 1, "enqueued_at": 1700000000, "sitemap_priority": null, "changefreq": null, "source": ""}',
            "",
            None,
        ),
    ],
)
def test_bad_bodies_raise_decode_error_with_a_reason(body: bytes, reason: str, fragment: str | None) -> None:
    if fragment is None:  # unknown fields are ignored: newer producers may add some
        assert CrawlTask.decode(body).url == "http://a.test/"
        return
    with pytest.raises(DecodeError) as caught:
        CrawlTask.decode(body)
    assert caught.value.reason == reason
    assert fragment in caught.value.detail


def test_progress_and_failure_survive_the_headers() -> None:
    progress = Progress(attempt=2, replays=1).failed_once_more(now=1700000000.75)
    failure = Failure("http_500", "server error", 500, "bulk", "host-1")
    headers = {**progress.to_headers(), **failure.to_headers()}
    assert Progress.from_headers(headers) == Progress(3, 1, 1700000000)
    assert Failure.from_headers(headers) == failure


def test_every_header_we_write_can_be_encoded_by_amqp() -> None:
    progress = Progress(attempt=1, replays=2, first_failure_at=1700000000.5)
    failure = Failure("timeout", "read timed out", None, "ttl", "host-1")
    properties = pika.BasicProperties(headers={**progress.to_headers(), **failure.to_headers()})
    assert properties.encode()  # raises UnsupportedAMQPFieldException for e.g. a float


def test_missing_or_foreign_headers_read_as_a_fresh_url() -> None:
    assert Progress.from_headers(None) == Progress()
    assert Progress.from_headers({"crawl-attempt": "2", "x-death": []}) == Progress()
    assert Failure.from_headers({}) is None
