"""The worker's own bound on redeliveries (worker/handling/poison.py), against the real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from shared.amqp.topology import POISON_DELIVERY_LIMIT, dead_letter_exchange
from shared.consumer import Delivery
from shared.messages import CrawlTask, Failure, Progress
from shared.redis.deferred_writes import DeferringRedis
from shared.redis.keys import Keys
from shared.settings import Settings
from worker.handling.poison import DeliveryLimit, message_fingerprint

BODY = CrawlTask(url="http://example.com/crash", run_id="r", queue="bulk").encode()


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(settings.redis_url)
    yield made
    made.close()


def delivery(redelivered: bool, **headers: object) -> Delivery:
    return Delivery("ns.bulk", BODY, {**Progress(attempt=1).to_headers(), **headers}, redelivered)


def test_a_message_is_handled_at_most_limit_times_then_dead_lettered(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    limit = DeliveryLimit(client, keys, "ns", "w1")
    key = keys.deliveries(message_fingerprint(delivery(True)))

    assert limit.check(delivery(False)) is None
    assert client.exists(key) == 0  # a first delivery costs no Redis call
    for _ in range(POISON_DELIVERY_LIMIT - 1):
        limit.mark_handling(delivery(False))  # the worker dies while fetching it, each time
        assert limit.check(delivery(True)) is None
    limit.mark_handling(delivery(False))
    outcome = limit.check(delivery(True))

    assert outcome is not None and outcome.ack
    (dead,) = outcome.publications
    assert (dead.exchange, dead.body) == (dead_letter_exchange("ns"), BODY)
    failure = Failure.from_headers(dead.headers)
    assert failure is not None and (failure.reason, failure.origin_queue) == ("delivery_limit", "ns.bulk")
    assert Progress.from_headers(dead.headers).attempt == 1  # crashes are not failures
    assert 0 < int(client.ttl(key)) <= 24 * 3600


def test_a_replayed_message_starts_counting_afresh(settings: Settings, client: redis.Redis) -> None:
    limit = DeliveryLimit(client, Keys(settings.redis_prefix), "ns", "w1", limit=2)
    limit.mark_handling(delivery(False))  # delivery 1 died while fetching
    assert limit.check(delivery(True)) is None  # delivery 2 of 2
    limit.mark_handling(delivery(False))  # and delivery 2 too
    assert limit.check(delivery(True)) is not None  # delivery 3: dead
    assert limit.check(delivery(True, **{"crawl-replays": 1})) is None  # replayed: counting afresh


def test_a_redelivery_of_a_message_nobody_started_on_is_not_counted(
    settings: Settings, client: redis.Redis
) -> None:
    # Messages a dead worker merely held in its prefetch buffer come back redelivered too.
    keys = Keys(settings.redis_prefix)
    limit = DeliveryLimit(client, keys, "ns", "w1", limit=1)
    buffered = Delivery("ns.bulk", b'{"held": "in a buffer"}', {}, True)
    assert limit.check(buffered) is None  # not counted: no handler had started fetching it
    assert client.get(keys.deliveries(message_fingerprint(buffered))) is None
    limit.mark_handling(buffered)
    limit.unmark_handling(buffered)  # handled to the end: its marker is gone
    assert limit.check(buffered) is None
    limit.mark_handling(buffered)  # the worker died while fetching it
    assert limit.check(buffered) is not None  # counted: delivery 2 of a limit of 1


def test_one_death_counts_once(settings: Settings, client: redis.Redis) -> None:
    # A message dies while being fetched, then its redelivery dies again in another worker's
    # buffer before anyone started on it: one suspect death, not two.
    limit = DeliveryLimit(client, Keys(settings.redis_prefix), "ns", "w1", limit=2)
    limit.mark_handling(delivery(False))
    assert limit.check(delivery(True)) is None  # delivery 2 of 2
    assert limit.check(delivery(True)) is None  # still 2 of 2: the marker was taken


def test_a_held_marker_is_in_redis_before_the_risky_part(settings: Settings, client: redis.Redis) -> None:
    # The worker's client holds the marker for the handling's next command (its cache read);
    # before_risk() sends it if no command came. Either way it is in Redis before the fetch.
    keys = Keys(settings.redis_prefix)
    worker_client = DeferringRedis.from_url(settings.redis_url)
    try:
        limit = DeliveryLimit(worker_client, keys, "ns", "w1")
        marker = keys.handling(message_fingerprint(delivery(False)))

        limit.mark_handling(delivery(False))
        assert client.exists(marker) == 0  # held
        assert worker_client.get(keys.handling("no-such-message")) is None  # the cache read
        assert client.get(marker) == b"w1"  # carried ahead of it
        assert 0 < int(client.ttl(marker)) <= 600

        client.delete(marker)
        limit.mark_handling(delivery(False))
        limit.before_risk()  # no command came between: sent now
        assert client.get(marker) == b"w1"
        limit.before_risk()  # nothing held: no-op
        assert limit.check(delivery(True)) is None  # the death it stands for counts
        assert client.exists(marker) == 0
    finally:
        worker_client.close()
