"""What the domain gate needs of the per-domain state every worker shares: the DomainLimiter
protocol, and the Reservation its `reserve` grants.

Apart from both sides so that each depends on this contract and not on the other: the gate
(worker/politeness/gate.py) asks, the Redis limiter (worker/politeness/ratelimit.py) answers, and the tests'
fake limiter answers from lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Reservation:
    """What the shared limiter granted (see worker.politeness.ratelimit.RateLimiter.reserve)."""

    wait_s: float
    reserved: bool
    reason: str = "ok"  # refused: rate | paused | busy
    lease: str = ""  # the concurrency lease to give back; empty when none was taken
    backoff: float = 1.0  # the domain's current interval multiplier (1 / its slow-down)
    # Due at once, and already recorded as sent (the clear_to_send check, folded in): the
    # caller can send without asking again.
    cleared: bool = False


class DomainLimiter(Protocol):
    """The shared per-domain state; worker.politeness.ratelimit.RateLimiter is the Redis one."""

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
    ) -> Reservation: ...

    def release(self, domain: str, lease: str) -> None: ...

    def clear_to_send(self, domain: str, spacing_s: float) -> tuple[bool, float, str]: ...

    def clear_held(
        self,
        domain: str,
        spacing_s: float,
        max_concurrent: int = 0,
        lease_s: float = 0.0,
        ahead_s: float = 0.0,
    ) -> tuple[bool, float, str, str]: ...

    def space_from_now(self, domain: str, spacing_s: float) -> None: ...

    def pause(self, domain: str, seconds: float) -> None: ...

    def slow_down(self, domain: str, rate_per_s: float, why: str = "429", burst: int = 1) -> float: ...
