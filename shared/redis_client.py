"""The one place Redis clients are made: `connect_redis(settings, use)`.

Clients differ only in how long they wait on Redis, and each wait is chosen for what the client
is used for. A timed-out or refused command becomes ServiceUnavailable where it is translated
(shared/redis_errors.py), so a wait is also how soon the caller hears that Redis is away.

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

import redis

from shared.redis_errors import translate_redis_errors
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
    ping: bool = False,
) -> redis.Redis:
    """A client of `client_class` (binary replies, no decoding) for settings.redis_url. With
    `ping`, it is checked at once, so a service that cannot start without Redis says so before
    doing anything else (ServiceUnavailable); otherwise it connects at its first command."""
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
