"""Redis writes that nobody waits for, sent in the same round trip as the thread's next command.

A page costs a handler Redis writes whose replies it never reads: the cache entry after the
fetch, the release of the domain's concurrency lease (worker/politeness/ratelimit.py) and the removal of
the "handling" marker (worker/handling/poison.py) at the end. Each was a round trip of its own, and each
round trip a handler thread makes is a system call, a wait and a GIL handoff. `defer()` holds
such a write for the calling thread; the thread's next command (under load, the next message's
check of whether its URL was handled) carries it along in one pipeline, in order, ahead of
itself, and `flush()` sends what is held when no command follows: the worker calls it whenever
a handler thread finds no message waiting.

Only writes whose moment does not matter may be deferred, or writes that are sent the moment
it comes: the "handling" marker, which must exist before a fetch, is held from the start of a
handling until the thread's next command (the domain gate's, ordinarily) carries it, and
`flush()` sends it just before the fetch if no command did. A held write that fails is logged
and dropped: a missing cache entry costs a refetch, a marker left behind expires by itself,
and a marker missing (only a Redis that refuses writes loses one) leaves one crash of that
message uncounted. If the round trip itself fails (Redis unreachable), the held writes are
lost with it and the caller's command fails as it would have alone.

A read can go ahead the same way: `read_ahead()` sends it with the thread's next command and
keeps the reply, and the same command issued later on that thread is answered from it without
a round trip. A handler sends the URL's cache read, and the run's state when its worker's copy
is stale, ahead of its "already handled?" check, the first command of every message: one round
trip where there were up to three. Reads are kept ahead for one handling (`drop_read_ahead()`
ends it), each answered once; a reply is as old as that handling, and one that failed is not
kept (the later read goes out and meets the error itself).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from redis.cluster import RedisCluster

log = logging.getLogger("worker.deferred_writes")  # the name operators know: kept as the module moved

_NO_REPLY = object()  # a read ahead not sent yet


class _Deferring:
    """Held writes for either client below. On a Redis Cluster the pipeline sends each command
    to the primary of its key's slot (one round trip per primary), never as a transaction."""

    _held: threading.local

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held = threading.local()  # first: a cluster client sends commands while it starts
        super().__init__(*args, **kwargs)

    def read_ahead(self, *command: Any) -> None:
        """Send the read `command`, e.g. read_ahead("GET", key), with this thread's next command,
        and answer the same command from its reply when it comes (see the module docstring).
        Adds to what this thread reads ahead."""
        self._reads_ahead()[command] = _NO_REPLY

    def drop_read_ahead(self) -> None:
        """Forget this thread's reads ahead, sent or not."""
        self._held.ahead = {}

    def defer(self, *command: Any) -> None:
        """Hold a write, e.g. defer("SET", key, value, "PX", 1000), for this thread's next command."""
        self._writes().append(command)

    def flush(self) -> None:
        """Send this thread's held writes now, if any."""
        if self._writes():
            self._send_with_held(None)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        ahead = self._reads_ahead()
        if ahead and _is_hashable(args) and args in ahead:
            reply = ahead.pop(args)
            if reply is not _NO_REPLY:
                return reply  # sent with an earlier command: no round trip now
            # not sent yet: this command is the read
        if not self._writes() and not any(reply is _NO_REPLY for reply in ahead.values()):
            return super().execute_command(*args, **options)  # type: ignore[misc]
        return self._send_with_held((args, options))

    def _reads_ahead(self) -> dict[tuple[Any, ...], Any]:
        """This thread's reads ahead, each with its reply or _NO_REPLY until it is sent."""
        ahead: dict[tuple[Any, ...], Any] | None = getattr(self._held, "ahead", None)
        if ahead is None:
            ahead = self._held.ahead = {}
        return ahead

    def _writes(self) -> list[tuple[Any, ...]]:
        writes: list[tuple[Any, ...]] | None = getattr(self._held, "writes", None)
        if writes is None:
            writes = self._held.writes = []
        return writes

    def _send_with_held(self, command: tuple[tuple[Any, ...], dict[str, Any]] | None) -> Any:
        writes = self._writes()
        held, writes[:] = list(writes), []
        reads = self._reads_to_send(command)
        pipe = self.pipeline(transaction=False)  # type: ignore[attr-defined]
        for write in held:
            pipe.execute_command(*write)
        for read in reads:
            pipe.execute_command(*read, keys=[read[1]])  # a cluster routes it by its key
        if command is not None:
            args, options = command
            pipe.execute_command(*args, **options)
        replies = pipe.execute(raise_on_error=False)  # lost with the round trip: writes and read
        for write, reply in zip(held, replies, strict=False):
            if isinstance(reply, Exception):
                log.warning("deferred Redis %s failed: %s", write[0], reply)
        for read, reply in zip(reads, replies[len(held) :], strict=False):
            # A failed read is not kept: the later read goes out and meets the error itself.
            if not isinstance(reply, Exception):
                self._reads_ahead()[read] = reply
        if command is None:
            return None
        reply = replies[-1]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _reads_to_send(self, command: tuple[tuple[Any, ...], dict[str, Any]] | None) -> list[tuple[Any, ...]]:
        """The reads ahead to send with `command`: they go with a command, not with a flush of
        writes alone, and once."""
        if command is None:
            return []
        ahead = self._reads_ahead()
        reads = [read for read, reply in ahead.items() if reply is _NO_REPLY]
        for read in reads:
            del ahead[read]  # until its reply is in: a failed round trip loses it
        return reads


def _is_hashable(command: tuple[Any, ...]) -> bool:
    try:
        hash(command)
    except TypeError:  # an argument no read ahead could have: it is not one of them
        return False
    return True


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


def read_ahead(client: redis.Redis, *command: Any) -> None:
    """`command` read ahead when the client can (see the module docstring); else nothing: the
    read goes out when it is made."""
    if isinstance(client, _Deferring):
        client.read_ahead(*command)


def drop_read_ahead(client: redis.Redis) -> None:
    if isinstance(client, _Deferring):
        client.drop_read_ahead()


def flush(client: redis.Redis) -> None:
    """Send what this thread holds, when the client holds writes at all."""
    if isinstance(client, _Deferring):
        client.flush()
