"""A producer run after another one died takes over its claims; one run beside a live producer
waits for that producer's claims instead of skipping them; a worker acks a second copy of a URL
it has settled without fetching it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.dedup import Dedup
from producer.service import Options, run
from shared.amqp import broker
from shared.amqp.topology import work_queue
from shared.messages import QUEUE_KINDS, CrawlTask
from shared.redis.client import PRODUCER, WORKER, connect_redis
from shared.redis.deferred_writes import DeferringRedis
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import canonicalize, fingerprint
from worker.handling.handled import (
    COPIES_RECEIVED,
    COPIES_REDELIVERED,
    COPY,
    DUPLICATES_COUNTER,
    FORWARDED,
    REDELIVERED,
    HandledMarks,
    seen_field,
)

RUN = "takeover-1"


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, PRODUCER, ping=True)
    yield made
    made.close()


def url_file(tmp_path: Path, n: int) -> tuple[str, list[str]]:
    urls = [f"http://127.0.0.1:9/page/{i}" for i in range(n)]
    path = tmp_path / "urls.txt"
    path.write_text("\n".join(urls) + "\n")
    return str(path), urls


def queued(settings: Settings) -> int:
    connection = broker.connect(settings, "test")
    try:
        channel = connection.channel()
        return sum(
            broker.queue_depth(channel, work_queue(settings.crawl_namespace, k))[0] for k in QUEUE_KINDS
        )
    finally:
        connection.close()


def test_a_rerun_takes_over_the_claims_a_killed_producer_left(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    path, urls = url_file(tmp_path, 100)
    fps = [fingerprint(canonicalize(u)) for u in urls]
    killed = Dedup(client, Keys(settings.redis_prefix), RUN)
    killed.claim(fps[:80])  # its heartbeat is fresh: as if it was killed a moment ago
    killed.confirm(fps[:30], {"enqueued.bulk": 30})

    result = run(settings, Options(run_id=RUN, url_files=(path,)))

    # 30 confirmed are duplicates; 50 claimed by the dead producer are taken over once its
    # heartbeat lapses, and published with the 20 nobody claimed. None is skipped in silence.
    assert result["duplicates"] == 30
    assert result["taken_over"] == 50 and result["republished"] == 50
    assert result["enqueued_total"] == 70 and result["left_claimed"] == 0
    assert queued(settings) == 70
    stats = client.hgetall(Keys(settings.redis_prefix).run_stats(RUN))
    assert stats[b"enqueued.bulk"] == b"100"  # each URL counted once across both processes
    assert stats[b"taken_over"] == b"50" and stats[b"republished"] == b"50"
    assert stats[b"duplicates"] == b"30"


def test_a_rerun_leaves_alone_what_a_live_producer_confirms(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    path, urls = url_file(tmp_path, 10)
    fps = [fingerprint(canonicalize(u)) for u in urls]
    keys = Keys(settings.redis_prefix)
    other = Dedup(client, keys, RUN)
    other.claim(fps)
    other.beat()
    other.confirm(fps[:4])  # before this run looks: 4 duplicates at once, 6 busy

    result = run(settings, Options(run_id=RUN, url_files=(path,)))

    # The 6 busy ones were asked for again; the other producer never confirmed them and its
    # heartbeat lapsed, so they were taken over: every URL is in the queue once.
    assert result["duplicates"] == 4 and result["taken_over"] == 6
    assert queued(settings) == 6


def counters(client: redis.Redis, keys: Keys) -> dict[str, int]:
    raw: dict[bytes, bytes] = client.hgetall(keys.run_stats(RUN))  # type: ignore[assignment]
    return {name.decode(): int(n) for name, n in raw.items()}


def test_the_worker_mark_makes_a_second_copy_a_counted_no_op(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    marks = HandledMarks(client, keys)
    task = CrawlTask(url="http://127.0.0.1:9/a", run_id=RUN, queue="bulk")
    # The first copy, as the producer published it: counted as received, not yet handled.
    assert marks.already_handled(task, COPY, from_producer=True) is False
    marks.mark_later(task)
    key, field = seen_field(keys, RUN, task.url)
    for _ in range(200):
        if client.hget(key, field) == b"h":
            break
        time.sleep(0.01)
    # A second message the producer published, then that same message redelivered, then a
    # retry copy a worker forwarded: each acked unfetched, each counted under its own kind.
    assert marks.already_handled(task, COPY, from_producer=True) is True
    assert marks.already_handled(task, REDELIVERED, from_producer=True) is True
    assert marks.already_handled(task, FORWARDED, from_producer=False) is True
    assert counters(client, keys) == {
        COPIES_RECEIVED: 2,  # the two messages the broker got from the producer
        COPIES_REDELIVERED: 1,
        DUPLICATES_COUNTER: 3,
        f"{DUPLICATES_COUNTER}.copy": 1,
        f"{DUPLICATES_COUNTER}.redelivered": 1,
        f"{DUPLICATES_COUNTER}.forwarded": 1,
    }
    # The producer's dedup reads the same field: the URL is a duplicate for it too.
    assert Dedup(client, keys, RUN).claim([fingerprint(task.url)]).is_new == [False]


def test_a_url_back_from_a_hold_is_checked_by_a_read_gone_ahead_and_counted_once(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    worker_client = connect_redis(settings, WORKER, client_class=DeferringRedis)
    try:
        marks = HandledMarks(worker_client, keys)
        task = CrawlTask(url="http://127.0.0.1:9/held", run_id=RUN, queue="bulk")
        assert marks.already_handled(task, COPY, from_producer=True) is False  # on arrival
        # Back from its hold: the mark is read with the thread's next command (the send's
        # clearance; here any command), and the check is answered from that reply.
        marks.read_ahead(task)
        worker_client.get(keys.run_state(RUN))
        key, field = seen_field(keys, RUN, task.url)
        client.hset(key, field, "h")  # another copy settles the URL after that read
        assert marks.already_handled(task, COPY, from_producer=True, counted=True) is False
        # Without a read ahead the check reads now, and counts the delivery a duplicate only.
        assert marks.already_handled(task, COPY, from_producer=True, counted=True) is True
        assert counters(client, keys) == {
            COPIES_RECEIVED: 1,
            DUPLICATES_COUNTER: 1,
            f"{DUPLICATES_COUNTER}.copy": 1,
        }
    finally:
        worker_client.close()
