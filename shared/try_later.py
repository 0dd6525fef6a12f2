"""TryLater: a URL that cannot be served now, which is not a failure, and the HeldSlot it
carries when its domain slot is already reserved.

Here in shared, apart from the worker's gate (worker/politeness/gate.py) which raises it most,
because robots.txt (worker/politeness/robots.py), the proxy pool (shared/http/proxies.py) and
the producer's fetches raise or catch it too, and need nothing else of the gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import PipelineError


@dataclass(frozen=True)
class HeldSlot:
    """A domain slot reserved for a held URL: due at `due` on the gate's clock."""

    domain: str
    due: float
    backoff: float = 1.0


class TryLater(PipelineError):
    """Not a failure: the URL cannot be served now and should come back after `wait_s`; with
    `slot`, its slot is reserved and the URL must come back with it (`DomainGate.call`)."""

    def __init__(self, wait_s: float, reason: str, slot: HeldSlot | None = None) -> None:
        self.wait_s = wait_s
        self.reason = reason
        self.slot = slot
        super().__init__(f"{reason}: try again in {wait_s:.3f} s")
