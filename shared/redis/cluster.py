"""Redis Cluster mode, named by the scheme of REDIS_URL.

    REDIS_URL=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003

lists nodes to start from (any of them will do: the client learns the rest and the slot map
from the first that answers). In this mode shared/redis/client.py makes a
`redis.cluster.RedisCluster`, and the code differs from standalone mode in three places only:
multi-key scripts get keys of one slot (shared/redis/keys.py puts the shared part in {braces}, and
callers with keys of many slots split their calls with `by_slot`), SCANs visit every primary
(RedisCluster.scan_iter does), and pipelines are never transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from redis.crc import key_slot

from shared.errors import ConfigError

CLUSTER_SCHEME = "redis+cluster"

T = TypeVar("T")


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME + "://")


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a redis+cluster:// URL; ConfigError names what is wrong."""
    rest = url[len(CLUSTER_SCHEME) + 3 :]
    if "@" in rest or "?" in rest:
        raise ConfigError("REDIS_URL: a redis+cluster:// URL takes host:port pairs only, without credentials")
    nodes: list[tuple[str, int]] = []
    for entry in rest.split("/", 1)[0].split(","):
        host, _, port = entry.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"REDIS_URL: expected host:port in a redis+cluster:// URL, got {entry!r}")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def slot_of(key: str | bytes) -> int:
    return int(key_slot(key.encode() if isinstance(key, str) else key))


def by_slot(keys: Sequence[str], items: Iterable[T]) -> dict[int, tuple[list[str], list[T]]]:
    """Keys and their items grouped by the cluster slot of each key, in their first order."""
    groups: dict[int, tuple[list[str], list[T]]] = {}
    for key, item in zip(keys, items, strict=True):
        group_keys, group_items = groups.setdefault(slot_of(key), ([], []))
        group_keys.append(key)
        group_items.append(item)
    return groups
