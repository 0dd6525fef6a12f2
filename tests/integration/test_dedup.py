from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
import redis

from producer.dedup import BUSY, DUP, NEW, TAKEN, Dedup, split_fingerprint
from shared.errors import ServiceUnavailable
from shared.redis.client import PRODUCER, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import fingerprint

RUN = "run-1"


def fingerprints(n: int) -> list[bytes]:
    return [fingerprint(f"http://example.com/page/{i}") for i in range(n)]


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, PRODUCER, ping=True)
    yield made
    made.close()


def test_concurrent_claims_make_each_fingerprint_new_exactly_once(settings: Settings) -> None:
    fps = fingerprints(2000)
    claimed: list[list[bytes]] = [[], []]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def claimer(slot: int) -> None:
        client = connect_redis(settings, PRODUCER, ping=True)
        try:
            dedup = Dedup(client, Keys(settings.redis_prefix), RUN)
            dedup.beat()  # alive: the other side's claims are busy, never taken over
            order = fps[:]
            random.Random(slot).shuffle(order)  # both race over every fingerprint
            barrier.wait()
            for start in range(0, len(order), 100):
                batch = order[start : start + 100]
                claim = dedup.claim(batch)
                claimed[slot] += [fp for fp, new in zip(batch, claim.is_new, strict=True) if new]
                assert not any(claim.taken_over)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=claimer, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    everything = claimed[0] + claimed[1]
    assert len(everything) == 2000
    assert set(everything) == set(fps)
    assert claimed[0] and claimed[1]  # a real race: both sides won some


def test_claim_confirm_release_life_cycle(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    dedup = Dedup(client, keys, RUN)
    fps = fingerprints(6)

    first = dedup.claim(fps[:4])
    assert first.is_new == [True] * 4
    # Claimed but unconfirmed, within the lease: another claim must not take them.
    assert dedup.claim(fps).is_new == [False] * 4 + [True] * 2

    dedup.confirm(fps[:2], {"enqueued.bulk": 2, "duplicates": 1, "invalid": 0})
    assert dedup.release(fps[2:4], first.token) == 2
    # Confirmed stay duplicates for good; released ones are new again.
    assert dedup.claim(fps[:4]).is_new == [False, False, True, True]

    bucket, field = split_fingerprint(fps[0])
    assert client.hget(keys.seen(RUN, bucket), field) == b"c"
    assert len(bucket) == 4 and len(field) == 8
    assert client.hgetall(keys.run_stats(RUN)) == {b"enqueued.bulk": b"2", b"duplicates": b"1"}


def test_a_repeat_inside_one_batch_is_new_once(settings: Settings, client: redis.Redis) -> None:
    dedup = Dedup(client, Keys(settings.redis_prefix), RUN)
    fp = fingerprints(1)[0]
    assert dedup.claim([fp, fp, fp]).is_new == [True, False, False]


def test_claims_of_a_dead_producer_are_taken_over(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    crashed = Dedup(client, keys, RUN)
    fps = fingerprints(4)
    stale = crashed.claim(fps[:3])
    crashed.confirm(fps[:1])
    assert stale.is_new == [True] * 3
    crashed.stop_beating()  # as its heartbeat lapses after a kill -9

    successor = Dedup(client, keys, RUN)
    claim = successor.claim(fps)
    assert claim.outcomes == [DUP, TAKEN, TAKEN, NEW]
    assert claim.is_new == [False, True, True, True]
    assert claim.taken_over == [False, True, True, False]
    # The crashed producer's late un-mark must not remove the successor's claims.
    assert crashed.release(fps, stale.token) == 0
    assert successor.claim(fps).is_new == [False] * 4


def test_claims_of_a_live_producer_are_busy_until_it_settles_them(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    first, second = Dedup(client, keys, RUN), Dedup(client, keys, RUN)
    fps = fingerprints(3)
    held = first.claim(fps)  # the claim call itself says `first` is alive
    assert second.claim(fps).outcomes == [BUSY, BUSY, BUSY]
    first.confirm(fps[:1])
    assert first.release(fps[1:2], held.token) == 1
    assert second.claim(fps).outcomes == [DUP, NEW, BUSY]
    first.stop_beating()
    assert second.claim(fps).outcomes == [DUP, DUP, TAKEN]


def test_a_lease_of_an_older_producer_counts_until_it_expires(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    fps = fingerprints(2)
    for fp, lease_end in zip(fps, [1, 4_000_000_000], strict=True):
        bucket, field = split_fingerprint(fp)
        client.hset(keys.seen(RUN, bucket), field, lease_end)
    assert Dedup(client, keys, RUN).claim(fps).outcomes == [TAKEN, BUSY]


def test_handled_urls_stay_handled(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    dedup = Dedup(client, keys, RUN)
    fp = fingerprints(1)[0]
    dedup.claim([fp])
    bucket, field = split_fingerprint(fp)
    client.hset(keys.seen(RUN, bucket), field, "h")  # a fast worker settled it before the mark
    dedup.confirm([fp])
    assert client.hget(keys.seen(RUN, bucket), field) == b"h"
    assert Dedup(client, keys, RUN).claim([fp]).outcomes == [DUP]


def test_runs_do_not_share_dedup(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    fps = fingerprints(2)
    Dedup(client, keys, "run-a").confirm(fps)
    assert Dedup(client, keys, "run-b").claim(fps).is_new == [True, True]


def test_scripts_are_reloaded_after_a_script_flush(settings: Settings, client: redis.Redis) -> None:
    dedup = Dedup(client, Keys(settings.redis_prefix), RUN)
    fps = fingerprints(4)
    assert dedup.claim(fps[:2]).is_new == [True, True]
    client.script_flush()  # as after a Redis restart: EVALSHA now answers NOSCRIPT
    assert dedup.claim(fps).is_new == [False, False, True, True]


def test_unreachable_redis_is_service_unavailable() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ServiceUnavailable) as caught:
        connect_redis(settings, PRODUCER, ping=True)
    assert "Redis" in str(caught.value) and "127.0.0.1:1" in str(caught.value)
