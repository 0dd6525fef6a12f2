"""Redis writes that nobody waits for, sent in the same round trip as the thread's next command.

A page costs a handler Redis writes whose replies it never reads: the cache entry after the
fetch, the release of the domain's concurrency lease (worker/ratelimit.py) and the removal of
the "handling" marker (worker/poison.py) at the end. Each was a round trip of its own, and each
round trip a handler thread makes is a system call, a wait and a GIL handoff. `defer()` holds
such a write for the calling thread; the thread's next command (under load, the next message's
cache read) carries it along in one pipeline, in order, ahead of itself, and `flush()` sends
what is held when no command follows: the worker calls it whenever a handler thread finds no
message waiting.

Only writes whose moment does not matter may be deferred, or writes that are sent the moment
it comes: the "handling" marker, which must exist before a fetch, is held from the start of a
handling until its cache read carries it, and `flush()` sends it just before the fetch if no
command did. A held write that fails is logged and dropped: a missing cache entry costs a
refetch, a marker left behind expires by itself, and a marker missing (only a Redis that
refuses writes loses one) leaves one crash of that message uncounted. If the round trip itself fails
(Redis unreachable), the held writes are lost with it and the caller's command fails as it
would have alone.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from redis.cluster import RedisCluster

log = logging.getLogger(__name__)


class _Deferring:
    """Held writes for either client below. On a Redis Cluster the pipeline sends each command
    to the primary of its key's slot (one round trip per primary), never as a transaction."""

    _held: threading.local

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held = threading.local()  # first: a cluster client sends commands while it starts
        super().__init__(*args, **kwargs)

    def defer(self, *command: Any) -> None:
        """Hold a write, e.g. defer("SET", key, value, "PX", 1000), for this thread's next command."""
        self._writes().append(command)

    def flush(self) -> None:
        """Send this thread's held writes now, if any."""
        if self._writes():
            self._send_with_held(None)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if not self._writes():
            return super().execute_command(*args, **options)  # type: ignore[misc]
        return self._send_with_held((args, options))

    def _writes(self) -> list[tuple[Any, ...]]:
        writes: list[tuple[Any, ...]] | None = getattr(self._held, "writes", None)
        if writes is None:
            writes = self._held.writes = []
        return writes

    def _send_with_held(self, command: tuple[tuple[Any, ...], dict[str, Any]] | None) -> Any:
        writes = self._writes()
        held, writes[:] = list(writes), []
        pipe = self.pipeline(transaction=False)  # type: ignore[attr-defined]
        for write in held:
            pipe.execute_command(*write)
        if command is not None:
            args, options = command
            pipe.execute_command(*args, **options)
        replies = pipe.execute(raise_on_error=False)
        for write, reply in zip(held, replies, strict=False):
            if isinstance(reply, Exception):
                log.warning("deferred Redis %s failed: %s", write[0], reply)
        if command is None:
            return None
        reply = replies[-1]
        if isinstance(reply, Exception):
            raise reply
        return reply


class DeferringRedis(_Deferring, redis.Redis):
    pass


class DeferringRedisCluster(_Deferring, RedisCluster):
    pass


def write_later(client: redis.Redis, *command: Any) -> None:
    """`command` deferred when the client can hold it, else sent now."""
    if isinstance(client, _Deferring):
        client.defer(*command)
    else:
        client.execute_command(*command)  # type: ignore[no-untyped-call]


def flush(client: redis.Redis) -> None:
    """Send what this thread holds, when the client holds writes at all."""
    if isinstance(client, _Deferring):
        client.flush()
