"""The one place where redis-py's connection errors become ServiceUnavailable (clients are made
in shared/redis/client.py).

A Redis that cannot be reached is not the fault of the URL being processed, so the caller
pauses instead of charging the URL a failed attempt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis
import redis.exceptions

from shared.errors import ServiceUnavailable, one_line
from shared.settings import redact

START_HINT = "start it with: redis-server --daemonize yes"


def redis_address(where: str | redis.Redis) -> str:
    """A printable address for a Redis URL or client, password removed."""
    if isinstance(where, str):
        return redact(where)
    if not hasattr(where, "connection_pool"):  # a RedisCluster: its first node names it
        nodes = getattr(where, "startup_nodes", {})
        return "cluster " + ",".join(str(name) for name in list(nodes)[:3])
    kwargs = where.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


@contextlib.contextmanager
def translate_redis_errors(where: str | redis.Redis) -> Iterator[None]:
    """Raise ServiceUnavailable for a refused, lost or timed-out Redis connection.

    `where` is the Redis URL (e.g. settings.redis_url) or the client, for the message only.
    """
    try:
        yield
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        # A Redis Cluster between a primary's death and its replica's promotion: the slots of
        # that primary are down for a moment, and the same command succeeds a little later.
        redis.exceptions.ClusterError,
        redis.exceptions.ClusterDownError,
        redis.exceptions.TryAgainError,
    ) as exc:
        raise ServiceUnavailable("Redis", redis_address(where), one_line(exc), START_HINT) from None
