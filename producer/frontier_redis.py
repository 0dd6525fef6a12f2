"""The frontier's reads and counts in Redis (producer/frontier.py's FrontierState), where a
discovery run's options are kept for it, and which frontiers hold a page of a run (PagesInHand)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import redis

from producer.dedup import split_fingerprint
from producer.discovery_scope import DiscoveryOptions
from shared.redis.keys import Keys
from shared.redis.runstate import CANCELLED, read_state, recorded_enqueued

# A run's options do not change once it is seeded; read again this often all the same, so that a
# frontier started before the producer wrote them sees them soon.
OPTIONS_FRESH_S = 5.0
STATE_FRESH_S = 1.0  # a cancel is seen this soon
# A frontier's mark that it holds a page of a run lasts this long if the frontier dies with it;
# settling a page takes milliseconds, or a few seconds when it waits out a dead frontier's claims.
HOLD_DEADLINE_S = 30.0
# While pages keep coming the mark is set again this often: a mark lost meanwhile (Redis
# restarted empty) is back within this, as it was by the next page when each page set its own.
HOLD_REFRESH_S = 5.0
_SEEN_STATES = (b"c", b"h")  # confirmed or handled; a claim is the pipeline's to judge


def keep_options(client: redis.Redis, keys: Keys, run_id: str, options: DiscoveryOptions) -> None:
    """Written by the producer before it publishes anything of the run."""
    client.set(keys.run_discovery(run_id), options.encode())


def _none_kept(_run_id: str) -> DiscoveryOptions | None:
    return None


class RedisFrontierState:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        durable: Callable[[str], DiscoveryOptions | None] = _none_kept,
    ) -> None:
        """`durable`: a run's options where they outlive Redis (producer/discovery_store.py)."""
        self._client = client
        self._keys = keys
        self._durable = durable
        self._options: dict[str, tuple[float, DiscoveryOptions | None]] = {}
        self._states: dict[str, tuple[float, str]] = {}

    def options(self, run_id: str) -> DiscoveryOptions | None:
        now = time.monotonic()
        kept = self._options.get(run_id)
        if kept is not None and (kept[1] is not None or now - kept[0] < OPTIONS_FRESH_S):
            return kept[1]
        raw = self._client.get(self._keys.run_discovery(run_id))
        options = DiscoveryOptions.decode(raw) if isinstance(raw, bytes) else None
        if options is None:
            # Redis restarted empty since the run was seeded (or the run does not discover):
            # the durable copy, put back in Redis for the next frontier.
            options = self._durable(run_id)
            if options is not None:
                keep_options(self._client, self._keys, run_id, options)
        self._options[run_id] = (now, options)
        return options

    def forget(self, run_id: str) -> None:
        self._options.pop(run_id, None)
        self._states.pop(run_id, None)

    def cancelled(self, run_id: str) -> bool:
        now = time.monotonic()
        kept = self._states.get(run_id)
        if kept is None or now - kept[0] >= STATE_FRESH_S:
            kept = self._states[run_id] = (now, read_state(self._client, self._keys, run_id))
        return kept[1] == CANCELLED

    def seen(self, run_id: str, fingerprints: Sequence[bytes]) -> list[bool]:
        with self._client.pipeline(transaction=False) as pipe:
            for fp in fingerprints:
                bucket, field = split_fingerprint(fp)
                pipe.hget(self._keys.seen(run_id, bucket), field)
            return [state in _SEEN_STATES for state in pipe.execute()]

    def enqueued_total(self, run_id: str) -> int:
        return recorded_enqueued(self._client, self._keys, run_id)

    def host_counts(self, run_id: str, hosts: Sequence[str]) -> dict[str, int]:
        values = self._client.hmget(self._keys.run_discovered_hosts(run_id), list(hosts))
        return {host: int(value) for host, value in zip(hosts, values, strict=True) if value is not None}

    def add(self, run_id: str, cut: dict[str, int], hosts: dict[str, int]) -> None:
        if not cut and not hosts:
            return
        with self._client.pipeline(transaction=False) as pipe:
            for name, n in cut.items():
                pipe.hincrby(self._keys.run_stats(run_id), name, n)
            for host, n in hosts.items():
                pipe.hincrby(self._keys.run_discovered_hosts(run_id), host, n)
            pipe.execute()


class PagesInHand:
    """Keys.run_frontier: a field per frontier holding a page of the run, its value the epoch
    milliseconds after which it no longer counts (a frontier killed holding one leaves it).

    A page's links wait in the discovery queue, then are unacked in the frontier until they are
    published: the queue's ready count cannot see the second part, this can. `ops.crawl` does
    not call a discovery run finished while a frontier holds one of its pages, and the
    dashboard can read the same key to say the total is still growing
    (shared/redis/runstate.py, frontier_holds_a_page).

    The mark is set before a page's links are looked at and stays while pages keep coming: it
    is set again only HOLD_REFRESH_S after it was last set, and taken away when the
    frontier finds no page waiting (`release_all`, its consumer loop's idle hook). Set and
    taken away for every page, it cost the frontier two Redis round trips a page."""

    def __init__(
        self, client: redis.Redis, keys: Keys, owner: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._client = client
        self._keys = keys
        self._owner = owner
        self._clock = clock
        self._held: dict[str, float] = {}  # run -> the deadline its mark was last given

    def hold(self, run_id: str) -> None:
        now = self._clock()
        deadline = self._held.get(run_id)
        if deadline is not None and deadline - now > HOLD_DEADLINE_S - HOLD_REFRESH_S:
            return
        deadline = now + HOLD_DEADLINE_S
        self._client.hset(self._keys.run_frontier(run_id), self._owner, int(deadline * 1000))
        self._held[run_id] = deadline

    def release_all(self) -> None:
        """Take this frontier's marks away. A failed removal leaves a mark to its deadline: the
        run only looks busy longer."""
        held, self._held = self._held, {}
        for run_id in held:
            with contextlib.suppress(redis.RedisError):
                self._client.hdel(self._keys.run_frontier(run_id), self._owner)
