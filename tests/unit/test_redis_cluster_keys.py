"""On a Redis Cluster every multi-key script gets keys of one slot, and REDIS_URL names the mode."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from producer.dedup import DUP, MINE, NEW, TAKEN, Dedup, split_fingerprint
from shared.errors import ConfigError
from shared.redis.client import PRODUCER, connect_redis
from shared.redis.cluster import by_slot, cluster_nodes, is_cluster_url, slot_of
from shared.redis.deferred_writes import DeferringRedis, DeferringRedisCluster
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import fingerprint

KEYS = Keys("crawl")
DOMAINS = ["example.com", "a.example.org", "127.0.0.2", "xn--bcher-kva.example"]


def slots(keys: list[str]) -> set[int]:
    return {slot_of(key) for key in keys}


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_rate_limit_scripts_keys_of_a_domain_share_a_slot(domain: str) -> None:
    reserve = [KEYS.rate(domain), KEYS.pause(domain), KEYS.backoff(domain), KEYS.inflight(domain)]
    assert len(slots([*reserve, KEYS.sent(domain)])) == 1


def test_different_domains_spread_over_slots() -> None:
    assert len(slots([KEYS.rate(f"host{n}.example") for n in range(50)])) > 40


def test_a_messages_poison_keys_share_a_slot() -> None:
    fp = "3f" * 16  # what worker.handling.poison.message_fingerprint gives: hex of a digest
    assert len(slots([KEYS.deliveries(fp), KEYS.handling(fp)])) == 1


def test_a_proxys_keys_share_a_slot() -> None:
    assert (
        len(slots([KEYS.proxy_failures("http://127.0.0.1:3128"), KEYS.proxy_bench("http://127.0.0.1:3128")]))
        == 1
    )


def test_dedup_buckets_of_one_group_and_its_heartbeats_share_a_slot() -> None:
    buckets = [KEYS.seen("run1", f"ab{n:02x}") for n in range(256)]
    heartbeats = [KEYS.producer_heartbeat("run1", owner, "ab") for owner in ("p1", "p2")]
    assert len(slots([*buckets, *heartbeats])) == 1


def test_dedup_groups_spread_over_the_slots_of_three_primaries() -> None:
    groups = [slot_of(KEYS.seen("run1", f"{g:02x}00")) for g in range(256)]
    per_primary = [
        sum(1 for s in groups if lo <= s <= hi) for lo, hi in ((0, 5460), (5461, 10922), (10923, 16383))
    ]
    assert len(set(groups)) > 250 and min(per_primary) > 256 // 3 * 0.7, per_primary


def test_standalone_dedup_keys_name_the_run_and_bucket() -> None:
    bucket, _field = split_fingerprint(fingerprint("http://127.0.0.1/a"))
    assert KEYS.seen("run1", bucket) == f"crawl:seen:{{run1:{bucket[:2]}}}{bucket[2:]}"


def test_by_slot_keeps_each_keys_item_and_first_order() -> None:
    keys = [KEYS.seen("r", "0001"), KEYS.seen("r", "ff00"), KEYS.seen("r", "0002")]
    groups = list(by_slot(keys, [0, 1, 2]).values())
    assert groups == [([keys[0], keys[2]], [0, 2]), ([keys[1]], [1])]


def test_a_retried_claim_gets_back_its_own_claims_once() -> None:
    fps = [b"a" * 10, b"b" * 10, b"a" * 10, b"c" * 10]
    # a and b were claimed by a call whose reply was lost; c by an earlier batch still in flight.
    outcomes = Dedup._settle_repeats(fps, [MINE, MINE, MINE, MINE], retried={b"a" * 10, b"b" * 10})
    assert outcomes == [NEW, NEW, DUP, DUP]
    assert Dedup._settle_repeats(fps[:2], [TAKEN, MINE], retried=set()) == [TAKEN, DUP]


def test_a_cluster_url_lists_its_nodes() -> None:
    url = "redis+cluster://127.0.0.1:7001,127.0.0.1:7002/0"
    assert is_cluster_url(url) and not is_cluster_url("redis://127.0.0.1:7001")
    assert cluster_nodes(url) == [("127.0.0.1", 7001), ("127.0.0.1", 7002)]


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://127.0.0.1", "redis+cluster://127.0.0.1:70000", "redis+cluster://:pw@127.0.0.1:7001"],
)
def test_a_bad_cluster_url_is_one_line(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"REDIS_URL": url})
    assert str(caught.value).startswith("REDIS_URL:") and "\n" not in str(caught.value)


def test_a_cluster_url_makes_a_cluster_client_of_the_class_asked_for() -> None:
    settings = Settings.from_env({"REDIS_URL": "redis+cluster://127.0.0.1:1"})
    # RedisCluster asks its startup nodes for the slot map at once: nobody answers on port 1.
    with pytest.raises(Exception, match=r"(?i)connect|cluster"):
        connect_redis(settings, PRODUCER, client_class=DeferringRedis, cluster_class=DeferringRedisCluster)
    assert issubclass(DeferringRedisCluster, RedisCluster)
