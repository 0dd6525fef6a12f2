"""A producer's heartbeat: while it beats, no other producer takes over this one's claims.

A thread says "alive" every BEAT_EVERY_S; the key lives HEARTBEAT_TTL_MS (producer/dedup.py),
so a process killed with SIGKILL is known dead that long after, and a re-run started at once
waits at most that long for the claims it left. A beat that fails (any Redis error) is tried again
at the next one: while Redis is away no one can claim anything anyway. If Redis stays away past
the TTL, another producer may take over claims this one still means to publish; the URL is then
published twice, which the worker's handled mark absorbs (worker/handling/handled.py).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Protocol

import redis.exceptions

log = logging.getLogger(__name__)

BEAT_EVERY_S = 1.0


class Beating(Protocol):
    def beat(self) -> None: ...
    def stop_beating(self) -> None: ...


class Heartbeat:
    """`with Heartbeat(dedup):` beats from entry to exit; the key is removed on a clean exit."""

    def __init__(self, dedup: Beating, every_s: float = BEAT_EVERY_S) -> None:
        self._dedup = dedup
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._dedup.beat()  # before the first claim: a failure here is a failure to start
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self._dedup.stop_beating()
        except redis.exceptions.RedisError as exc:
            log.warning("could not remove the producer's heartbeat (it expires by itself): %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._dedup.beat()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                log.debug("heartbeat not sent: %s", exc)
            except redis.exceptions.RedisError as exc:
                # Say a Redis that is loading, read-only or out of memory: the thread must live
                # on, or the key expires and another producer takes over claims still ours.
                log.warning("heartbeat not sent (tried again in %.0f s): %s", self._every_s, exc)
