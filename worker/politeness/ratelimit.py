"""Per-domain politeness state shared by every worker: GCRA, pauses, backoff and concurrency
leases, each decision in one Redis Lua script (worker/politeness/ratelimit_scripts.py).

GCRA (the generic cell rate algorithm) keeps a single number per domain, the theoretical
arrival time (TAT) of the next request. A reservation moves the TAT one interval on and
tells the caller how long to wait before fetching. The scripts read the clock with
redis.call('TIME'), so workers on hosts with skewed clocks still share one timeline, and they
read and write atomically, so concurrent workers never take the same slot.

The reservation script honours, in the same atomic step:
- a pause (keys.pause): no slot before it ends (a server's Retry-After);
- the adaptive slow-down (keys.backoff): the rate cut to 70% on a 429 or 503 without
  Retry-After, a burst of 403s or rising latency (`slow_down`), growing back by itself along a
  cubic in time over RATE_RECOVERY_S (ratelimit_scripts._RATE_FRACTION_LUA); the send checks
  stretch their spacing by it too, so slots reserved before the cut leave at the slower rate;
- an optional jitter (RATE_JITTER): each slot's interval lengthened by a random share of it;
- a concurrency cap (keys.inflight): a sorted set of leases scored by expiry. A worker that
  dies holding one cannot leak the slot: the lease simply expires.

A reserved slot says when to send; `clear_to_send`, just before sending, checks what actually
went out (keys.sent): a request that woke late pushes the next one back by as much, instead of
letting the two arrive closer together than the rate allows. It also reads the pause again, for
a 429 that arrived while the caller slept. A slot due at once needs no sleep, so the reservation
makes that check itself (`Reservation.cleared`) and the request costs one script call.
"""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass

import redis

from shared.redis.deferred_writes import write_later
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from worker.politeness.domain_limiter import Reservation
from worker.politeness.ratelimit_scripts import (
    CLEAR_HELD_LUA,
    CLEAR_TO_SEND_LUA,
    PAUSE_LUA,
    RESERVE_LUA,
    SLOW_DOWN_LUA,
    SPACE_FROM_NOW_LUA,
)

log = logging.getLogger("worker.ratelimit")  # the name operators know: kept as the module moved

__all__ = ["RateLimiter", "Reservation", "Slowdown", "slowed_domains"]

BETA = 0.7  # a slow-down cuts the rate to this share (as _RATE_FRACTION_LUA's BETA)
MAX_SLOWDOWN = 64.0  # the rate never falls below 1/64 of the configured one
DEFAULT_RECOVERY_S = 60.0
BURST_WINDOW_S = 10.0  # the answers that make a burst (slow_down's `burst`) come this close together


@dataclass(frozen=True)
class Slowdown:
    """A domain slowed down now: its rate as a share of the configured one, why, how long ago."""

    fraction: float
    reason: str
    since_s: float


def rate_fraction(wmax: float, since_s: float, recovery_s: float, w0: float | None = None) -> float:
    """_RATE_FRACTION_LUA in Python, for status: the share of the configured rate `since_s`
    after a cut to `w0` (BETA * wmax unless given), growing back towards `wmax`."""
    if wmax <= 0:
        return 1.0
    start = BETA * wmax if w0 is None else w0
    k = ((wmax - start) / (1 - BETA)) ** (1 / 3)
    w = (1 - BETA) * (since_s / recovery_s - k) ** 3 + wmax
    return float(min(1.0, max(start, w)))


def slowed_domains(client: redis.Redis, keys: Keys, recovery_s: float) -> dict[str, Slowdown]:
    """Every domain slowed down now, from its backoff hash (a scan: for status, not workers)."""
    prefix, suffix = keys.backoff("\0").split("\0")
    with translate_redis_errors(client):
        seconds, micros = client.time()
        now_s = int(seconds) + int(micros) / 1e6
        found: dict[str, Slowdown] = {}
        for key in client.scan_iter(keys.backoff("*"), count=1000):
            fields = {_text(k): _text(v) for k, v in client.hgetall(key).items()}
            if "wmax" not in fields:
                continue
            since_s = now_s - int(fields.get("at", "0")) / 1e6
            w0 = float(fields["w0"]) if "w0" in fields else None
            fraction = rate_fraction(float(fields["wmax"]), since_s, recovery_s, w0)
            if fraction < 1.0:
                domain = _text(key)[len(prefix) : -len(suffix)]
                found[domain] = Slowdown(fraction, fields.get("why", "?"), since_s)
    return found


class RateLimiter:
    """The Redis implementation of worker.politeness.domain_limiter.DomainLimiter."""

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        recovery_s: float = DEFAULT_RECOVERY_S,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        self._client = redis_client
        self._keys = keys
        self._recovery_us = round(recovery_s * 1_000_000)
        self._jitter = jitter
        self._rng = rng or random.Random()
        # register_script sends EVALSHA and reloads the script on NOSCRIPT by itself.
        self._reserve = redis_client.register_script(RESERVE_LUA)
        self._clear_to_send = redis_client.register_script(CLEAR_TO_SEND_LUA)
        self._clear_held = redis_client.register_script(CLEAR_HELD_LUA)
        self._space_from_now = redis_client.register_script(SPACE_FROM_NOW_LUA)
        self._pause = redis_client.register_script(PAUSE_LUA)
        self._slow_down = redis_client.register_script(SLOW_DOWN_LUA)

    def reserve(
        self,
        domain: str,
        rate_per_s: float,
        burst: int = 1,
        *,
        max_wait_s: float,
        max_concurrent: int = 0,
        lease_s: float = 0.0,
        lease_within_s: float | None = None,
    ) -> Reservation:
        """Reserve the domain's next slot if it comes within `max_wait_s`.

        `burst` requests may go back to back after an idle spell; after that they are spaced
        1/rate_per_s apart (stretched by the slow-down), and none before a pause ends. With
        `max_concurrent` > 0 a lease is taken too, refused (reason 'busy') when that many are
        held; it lasts the wait plus `lease_s`, or until `release`. With reserved=True the
        caller sleeps `wait_s`, then fetches. A slot more than `lease_within_s` away (when
        given) is reserved without a lease: the caller holds its URL and takes the lease with
        `clear_held` when the slot comes.
        """
        if rate_per_s <= 0 or burst < 1 or max_wait_s < 0 or max_concurrent < 0:
            raise ValueError(
                f"need rate_per_s > 0, burst >= 1, max_wait_s >= 0, max_concurrent >= 0; got "
                f"{rate_per_s}, {burst}, {max_wait_s}, {max_concurrent}"
            )
        interval_us = 1_000_000 / rate_per_s
        lease = uuid.uuid4().hex if max_concurrent else ""
        args: list[int | str] = [
            round(interval_us),
            round(interval_us * (burst - 1)),
            round(max_wait_s * 1_000_000),
            max_concurrent,
            round(lease_s * 1_000_000),
            lease,
            round((max_wait_s if lease_within_s is None else lease_within_s) * 1_000_000),
            self._recovery_us,
            f"{self._jitter * self._rng.random():.6f}",
        ]
        # Domains are case-insensitive; one spelling must not get a second budget.
        domain = domain.lower()
        keys = [
            self._keys.rate(domain),
            self._keys.pause(domain),
            self._keys.backoff(domain),
            self._keys.inflight(domain),
            self._keys.sent(domain),
        ]
        with translate_redis_errors(self._client):
            reserved, wait_us, reason, multiplier, *cleared = self._reserve(keys=keys, args=args)
        leased = bool(reserved) and (lease_within_s is None or int(wait_us) <= round(lease_within_s * 1e6))
        reservation = Reservation(
            wait_s=int(wait_us) / 1_000_000,
            reserved=bool(reserved),
            reason=_text(reason),
            lease=lease if leased else "",
            backoff=float(_text(multiplier)),
            cleared=bool(cleared and cleared[0]),
        )
        if not reservation.reserved:
            log.debug(
                "rate limit: %s refused (%s), wait %.3f s, max %.3f s",
                domain,
                reservation.reason,
                reservation.wait_s,
                max_wait_s,
            )
        return reservation

    def clear_to_send(self, domain: str, spacing_s: float) -> tuple[bool, float, str]:
        """Record a request going out now, unless the domain is paused or its previous request
        left less than `spacing_s` ago: then (False, seconds to wait, 'paused' | 'spacing')."""
        domain = domain.lower()
        keys = [self._keys.sent(domain), self._keys.pause(domain), self._keys.backoff(domain)]
        args = [round(spacing_s * 1_000_000), 0, self._recovery_us]
        with translate_redis_errors(self._client):
            cleared, wait_us, reason = self._clear_to_send(keys=keys, args=args)
        return bool(cleared), int(wait_us) / 1_000_000, _text(reason)

    def clear_held(
        self,
        domain: str,
        spacing_s: float,
        max_concurrent: int = 0,
        lease_s: float = 0.0,
        ahead_s: float = 0.0,
    ) -> tuple[bool, float, str, str]:
        """`clear_to_send` for a slot reserved without a lease, taking the lease too (when
        `max_concurrent` > 0): (cleared, seconds to wait, reason, lease). Refused while paused,
        too soon after the previous request ('spacing'), or at the cap ('busy'). A send that
        the spacing keeps back by at most `ahead_s` is cleared for the moment it may go: then
        the caller sleeps the wait returned, and sends."""
        domain = domain.lower()
        lease = uuid.uuid4().hex if max_concurrent else ""
        keys = [
            self._keys.sent(domain),
            self._keys.pause(domain),
            self._keys.backoff(domain),
            self._keys.inflight(domain),
        ]
        args: list[int | str] = [
            round(spacing_s * 1_000_000),
            round(ahead_s * 1_000_000),
            self._recovery_us,
            max_concurrent,
            round(lease_s * 1_000_000),
            lease,
        ]
        with translate_redis_errors(self._client):
            cleared, wait_us, reason = self._clear_held(keys=keys, args=args)
        return bool(cleared), int(wait_us) / 1_000_000, _text(reason), lease if cleared else ""

    def space_from_now(self, domain: str, spacing_s: float) -> None:
        """Space the domain's next request `spacing_s` from now rather than from when the
        latest one was cleared: now is its answer (DomainGate.call, `spaced_from_answer`), or
        it is leaving late (DomainGate._note_if_late)."""
        with translate_redis_errors(self._client):
            self._space_from_now(keys=[self._keys.sent(domain.lower())], args=[round(spacing_s * 1_000_000)])

    def release(self, domain: str, lease: str) -> None:
        """Give a concurrency lease back before it expires.

        Sent with this thread's next Redis command when the client holds writes
        (shared/redis/deferred_writes.py), at the latest when the thread runs out of messages: a lease
        kept a few milliseconds longer only makes the domain's cap stricter, and the thread's
        next reservation carries the release ahead of itself. Lost with Redis, it expires."""
        with translate_redis_errors(self._client):  # a plain client sends it at once
            write_later(self._client, "ZREM", self._keys.inflight(domain.lower()), lease)

    def pause(self, domain: str, seconds: float) -> None:
        """No worker gets a slot for `seconds` from now (unless a longer pause is already set)."""
        with translate_redis_errors(self._client):
            self._pause(keys=[self._keys.pause(domain.lower())], args=[max(1, round(seconds * 1000))])

    def paused_s(self, domain: str) -> float:
        with translate_redis_errors(self._client):
            remaining_ms = int(self._client.pttl(self._keys.pause(domain.lower())))
        return max(0, remaining_ms) / 1000

    def slow_down(self, domain: str, rate_per_s: float, why: str = "429", burst: int = 1) -> float:
        """Cut the domain's rate to 70%, for every worker, at most once per interval; with
        `burst` > 1, only at the burst-th such answer within BURST_WINDOW_S. Return the
        interval multiplier now (1 / the share of the configured rate)."""
        args: list[int | float | str] = [
            round(1_000_000 / rate_per_s),
            1 / MAX_SLOWDOWN,
            self._recovery_us,
            why,
            burst,
            round(BURST_WINDOW_S * 1_000_000),
        ]
        with translate_redis_errors(self._client):
            domain = domain.lower()
            keys = [self._keys.backoff(domain), self._keys.sent(domain)]
            fraction, _cut = self._slow_down(keys=keys, args=args)
        return 1 / float(_text(fraction))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
