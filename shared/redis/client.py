"""The one place Redis clients are made: `connect_redis(settings, use)`.

A redis+cluster:// REDIS_URL makes a RedisCluster instead (shared/redis/cluster.py); the waits
below are the same in both modes.

Clients differ only in how long they wait on Redis, and each wait is chosen for what the client
is used for. A timed-out or refused command becomes ServiceUnavailable where it is translated
(shared/redis/errors.py), so a wait is also how soon the caller hears that Redis is away.

    use         command  connect  why
    PRODUCER    30 s     5 s      one claim script covers a whole batch of fingerprints; on a
                                  busy Redis it may take seconds, and a timeout stops the run
    WORKER      5 s      5 s      every URL makes several small calls: a stuck Redis must pause
                                  the handler threads soon, and a pooled connection idle for
                                  10 s is PINGed before use, so one dropped while idle is not a
                                  failed call
    GLANCE      3 s      3 s      the worker's presence heartbeat (joined at exit for two of
                                  these) and `status`, which an operator waits on
    OPERATOR    10 s     5 s      operator commands and the crawl's own calls: few, some a SCAN
                                  over many keys, with a person or a run waiting on the answer
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import redis
from redis.cluster import ClusterNode, RedisCluster

from shared.redis.cluster import cluster_nodes, is_cluster_url
from shared.redis.errors import translate_redis_errors
from shared.settings import Settings


@dataclass(frozen=True)
class RedisUse:
    """How long a client may wait on Redis (see the table above for why)."""

    name: str
    command_timeout_s: float
    connect_timeout_s: float
    idle_check_s: float = 0.0  # PING a pooled connection idle this long before using it; 0: never


PRODUCER = RedisUse("producer", command_timeout_s=30.0, connect_timeout_s=5.0)
WORKER = RedisUse("worker", command_timeout_s=5.0, connect_timeout_s=5.0, idle_check_s=10.0)
GLANCE = RedisUse("glance", command_timeout_s=3.0, connect_timeout_s=3.0)
OPERATOR = RedisUse("operator", command_timeout_s=10.0, connect_timeout_s=5.0)


def connect_redis(
    settings: Settings,
    use: RedisUse,
    *,
    client_class: type[redis.Redis] = redis.Redis,
    cluster_class: type[RedisCluster] = RedisCluster,
    ping: bool = False,
) -> redis.Redis:
    """A client of `client_class` (binary replies, no decoding) for settings.redis_url, or of
    `cluster_class` for a redis+cluster:// URL. With `ping`, it is checked at once, so a service
    that cannot start without Redis says so before doing anything else (ServiceUnavailable);
    otherwise it connects at its first command."""
    client: redis.Redis
    if is_cluster_url(settings.redis_url):
        client = _cluster_client(settings.redis_url, use, cluster_class)
    else:
        client = client_class.from_url(
            settings.redis_url,
            socket_timeout=use.command_timeout_s,
            socket_connect_timeout=use.connect_timeout_s,
            health_check_interval=use.idle_check_s,
        )
    if ping:
        try:
            with translate_redis_errors(settings.redis_url):
                client.ping()
        except BaseException:
            client.close()
            raise
    return client


def _cluster_client(url: str, use: RedisUse, cluster_class: type[RedisCluster]) -> redis.Redis:
    """A cluster client, typed as redis.Redis. While a dead primary's replica takes over, a
    command to its slots fails; the client re-reads the slot map and retries with backoff (its
    defaults) before the caller hears ServiceUnavailable and pauses on its own.

    Typed as redis.Redis: it answers the same commands, and the few places
    where a cluster differs (scripts over keys of many slots, SCAN, pipelines) check for
    RedisCluster themselves (shared/redis/cluster.py)."""
    client = cluster_class(
        startup_nodes=[ClusterNode(host, port) for host, port in cluster_nodes(url)],  # type: ignore[no-untyped-call]
        socket_timeout=use.command_timeout_s,
        socket_connect_timeout=use.connect_timeout_s,
        health_check_interval=use.idle_check_s,
    )
    return cast(redis.Redis, client)
