"""Whether a run is running, paused or cancelled, as workers see it.

An operator sets the state with `python -m ops.runs pause|resume|cancel RUN`; it lives in
Redis under Keys.run_state(run), with no expiry, and its absence means running. A worker asks
before it fetches a URL: a paused run's message is moved once to the run's hold queue, where it
waits without being delivered again; a cancelled run's message is recorded as a skip with reason
`cancelled`. The answer is kept for `MAX_AGE_S` per run, so a worker asks Redis at most once a
second per run, whatever its rate, and sees a change within that second. A worker's read rides
with the message's "already handled?" check (`read_ahead`), not in a round trip of its own.

The hold queues: one durable direct exchange `<ns>.held`, in the topology every service
declares, and a queue `<ns>.held.<run>` bound to it with the run id as its key, declared by
`pause` before it sets the state, so a worker that sees the state always finds where to publish.
`resume` and `cancel` unbind the queue before they empty and delete it; a worker's hold that
finds no queue bound goes to a defer queue instead (worker/handling/forwards.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys

RUNNING = "running"
PAUSED = "paused"
CANCELLED = "cancelled"
STATES = (RUNNING, PAUSED, CANCELLED)
MAX_AGE_S = 1.0
_MAX_RUNS_KEPT = 1024  # a worker sees few runs at once; the cache is emptied past this


def held_exchange(ns: str) -> str:
    return f"{ns}.held"


def held_queue(ns: str, run_id: str) -> str:
    return f"{ns}.held.{run_id}"


class RunStates:
    """A worker's cached view of run states: `state(run_id)` costs a Redis GET at most once per
    `max_age_s` for each run."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._keys = keys
        self._max_age_s = max_age_s
        self._clock = clock
        self._known: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def state(self, run_id: str) -> str:
        now = self._clock()
        if (kept := self._kept(run_id, now)) is not None:
            return kept
        # Redis down: ServiceUnavailable, and the consumer pauses with the message unacked.
        with translate_redis_errors(self._client):
            raw = self._client.get(self._keys.run_state(run_id))
        state = decode_state(raw)
        with self._lock:
            if len(self._known) >= _MAX_RUNS_KEPT:
                self._known.clear()
            self._known[run_id] = (state, now)
        return state

    def read_ahead(self, run_id: str) -> None:
        """Start reading the run's state for the state(run_id) to come on this thread, if the
        copy kept will not answer it and the client reads ahead (shared/redis/deferred_writes.py:
        the read then rides with the thread's next command)."""
        send_ahead = getattr(self._client, "read_ahead", None)
        if send_ahead is not None and self._kept(run_id, self._clock()) is None:
            send_ahead("GET", self._keys.run_state(run_id))

    def drop_read_ahead(self) -> None:
        if (drop := getattr(self._client, "drop_read_ahead", None)) is not None:
            drop()

    def _kept(self, run_id: str, now: float) -> str | None:
        """The state kept for the run, if it is recent enough to answer."""
        with self._lock:
            known = self._known.get(run_id)
        if known is not None and now - known[1] < self._max_age_s:
            return known[0]
        return None


def decode_state(raw: object) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    return raw if isinstance(raw, str) and raw in STATES else RUNNING


def read_state(client: redis.Redis, keys: Keys, run_id: str) -> str:
    with translate_redis_errors(client):
        return decode_state(client.get(keys.run_state(run_id)))


def write_state(client: redis.Redis, keys: Keys, run_id: str, state: str) -> None:
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}")
    with translate_redis_errors(client):
        if state == RUNNING:
            client.delete(keys.run_state(run_id))
        else:
            client.set(keys.run_state(run_id), state)


def recorded_enqueued(client: redis.Redis, keys: Keys, run_id: str) -> int:
    """URLs the run's producers have published, every invocation together, each URL once: the
    sum of the `enqueued.<queue>` counters they add to the run's stats as they mark confirmed
    URLs seen. The broker may have got more copies (ops/copies.py)."""
    return sum(
        n for name, n in recorded_counters(client, keys, run_id).items() if name.startswith("enqueued.")
    )


def recorded_counters(client: redis.Redis, keys: Keys, run_id: str) -> dict[str, int]:
    """The run's numeric counters (the run's stats hash)."""
    with translate_redis_errors(client):
        stats: dict[bytes, bytes] = client.hgetall(keys.run_stats(run_id))  # type: ignore[assignment]
    return {name.decode(): int(n) for name, n in stats.items() if n.lstrip(b"-").isdigit()}


def frontier_holds_a_page(client: redis.Redis, keys: Keys, run_id: str) -> bool:
    """Whether a frontier holds a page of the run now, by the marks producer/frontier_redis.py's
    PagesInHand leaves (their deadlines are epoch times: a reader on another machine needs a
    clock within seconds of the frontier's)."""
    marks: dict[bytes, bytes] = client.hgetall(keys.run_frontier(run_id))  # type: ignore[assignment]
    now_ms = time.time() * 1000
    return any(int(deadline) > now_ms for deadline in marks.values())
