"""The local Redis Cluster of deploy/local/redis-cluster.sh, as the cluster tests see it: settings
with unique names pointing at it, and its nodes by role, to find and kill a primary."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from shared.redis.cluster import slot_of
from shared.settings import Settings
from tests.conftest import cleanup, unique_name

PORTS = [int(p) for p in os.environ.get("REDIS_CLUSTER_PORTS", "7001 7002 7003 7004 7005 7006").split()]
HOST = "127.0.0.1"
CLUSTER_URL = "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in PORTS[:3])


@dataclass(frozen=True)
class Node:
    port: int
    primary: bool
    slots: list[tuple[int, int]]
    node_id: str
    primary_id: str  # of a replica: its primary's id

    def serves(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


def node_client(port: int) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, socket_timeout=2, socket_connect_timeout=2)


def nodes() -> list[Node]:
    """The cluster as the first node that answers sees it (failed nodes left out)."""
    for port in PORTS:
        try:
            table = node_client(port).execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call]  # parsed by redis-py
        except redis.RedisError:
            continue
        return [
            Node(
                port=int(address.split("@")[0].rsplit(":", 1)[1]),
                primary="master" in info["flags"],
                slots=[(int(lo), int(hi)) for lo, hi in info["slots"]],
                node_id=info["node_id"],
                primary_id=info["master_id"],
            )
            for address, info in table.items()
            if "fail" not in info["flags"] and "noaddr" not in info["flags"]
        ]
    pytest.skip(f"no Redis Cluster answers on {HOST}:{PORTS}; start it with `make redis-cluster-up`")


def primary_of(key: str) -> Node:
    slot = slot_of(key)
    return next(node for node in nodes() if node.primary and node.serves(slot))


def replica_of(primary: Node) -> Node:
    return next(node for node in nodes() if not node.primary and node.primary_id == primary.node_id)


def wait_healthy(timeout_s: float = 30.0, members: int = 6) -> None:
    """Until the cluster says ok and has three primaries, `members` nodes in all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = nodes()
        try:
            info = node_client(found[0].port).execute_command("CLUSTER INFO") if found else {}  # type: ignore[no-untyped-call]
        except redis.RedisError:
            info = {}
        if info.get("cluster_state") == "ok" and sum(n.primary for n in found) == 3 and len(found) == members:
            return
        time.sleep(0.2)
    raise AssertionError(f"the Redis Cluster on {PORTS} is not healthy after {timeout_s} s")


@contextlib.contextmanager
def cluster_settings(**extra: str) -> Iterator[Settings]:
    """Settings with unique names on the local cluster; what they made is removed afterwards."""
    nodes()  # skips, saying why, when no cluster is up
    name = unique_name()
    made = Settings.from_env(
        {
            "CRAWL_NAMESPACE": name,
            "REDIS_PREFIX": name,
            "PG_SCHEMA": name,
            "REDIS_URL": CLUSTER_URL,
            "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/crawler_test",
            "RETRY_DELAYS_S": "0.5,1",
            "TTL_QUEUE_EXPIRY_S": "60",
            "FETCH_ALLOWLIST": "127.0.0.0/8",
            **extra,
        }
    )
    try:
        yield made
    finally:
        cleanup(made)
