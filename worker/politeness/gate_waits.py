"""What one request waited at the domain gate, in-process, and its count in the rate-limit wait
metrics (RATE_LIMIT_WAITS, RATE_LIMIT_WAIT_SECONDS).

Apart from the gate (worker/politeness/gate.py), which makes one for each request and sleeps through
it: the gate decides when to wait, this only keeps the tally and the moment the send was cleared
for.
"""

from __future__ import annotations

from collections.abc import Callable

from shared import metrics


class Waits:
    """The in-process waits of one request at the gate, counted once in the rate-limit wait
    metrics however many sleeps (busy polls, the slot, the spacing) they took."""

    def __init__(self, sleep: Callable[[float], None]) -> None:
        self._sleep = sleep
        self.seconds = 0.0
        # The moment, on the gate's clock, the send was cleared for: when the clearance was
        # asked (Redis records it between that and the reply), plus the wait it was cleared
        # ahead by. None until cleared.
        self.cleared_for: float | None = None

    def sleep(self, seconds: float) -> None:
        self.seconds += seconds
        self._sleep(seconds)

    def add(self, seconds: float) -> None:
        """A wait that already happened (for a turn in a busy line)."""
        self.seconds += max(0.0, seconds)

    def count(self) -> None:
        """Once the waiting is over (and again on the way out, which then adds nothing)."""
        if self.seconds > 0:
            metrics.RATE_LIMIT_WAITS.inc()
            metrics.RATE_LIMIT_WAIT_SECONDS.inc(self.seconds)
            self.seconds = 0.0
