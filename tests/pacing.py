"""Assertions about pace that hold on a machine of any speed.

A request reaches a test's site some time after the limiter cleared it: the sending thread may
be descheduled in between, and on a loaded machine for much of a second. So two requests
cleared a whole spacing apart can arrive almost together. A count of arrivals in a fixed short
window then fails on a slow machine though the limiter kept its rate. What does hold is this:
the k-th request after another was cleared at least k spacings later, so it arrives no earlier
than k spacings minus the longest lateness. The checks here allow that lateness once, over the
whole span, and so still catch a limiter that lets even a fifth more requests through over a
few seconds; and they judge "near the rate" by the typical gap, which one late request cannot
move, rather than by a count of requests made within a fixed time.

For waits the limiter computes from its own clock (Redis's), `WaitClock` brackets what a wait
may be from how long the test itself took between the calls.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

# The longest a request may take from its clearance to its arrival at the site, on a loaded
# 2-core machine. Generous on purpose: it loosens the check by this many intervals once, not
# per request.
ARRIVAL_LATENESS_S = 1.0


def most_over_pace(
    times: Sequence[float], rate_per_s: float, lateness_s: float = ARRIVAL_LATENESS_S
) -> float:
    """How far the arrivals in `times` ran ahead of `rate_per_s` in their worst stretch, in
    requests: the most, over every pair of arrivals i < j, of (j - i) - rate * (t_j - t_i +
    lateness). A limiter that keeps the rate gives at most 0 (plus a burst it allows); one that
    does not gives more the longer it runs."""
    ordered = sorted(times)
    worst = float("-inf")
    for i, earlier in enumerate(ordered):
        for j in range(i + 1, len(ordered)):
            worst = max(worst, (j - i) - rate_per_s * (ordered[j] - earlier + lateness_s))
    return worst


def typical_gap_s(times: Sequence[float]) -> float:
    """The median gap between consecutive arrivals: a late request shortens one gap and
    lengthens the next, and leaves the median where the limiter's spacing put it."""
    ordered = sorted(times)
    return statistics.median(later - earlier for earlier, later in itertools.pairwise(ordered))


class WaitClock:
    """Brackets a wait the limiter computes on its own clock.

    A slot is fixed on Redis's clock when it is reserved; a later call sees it that much
    nearer. Started just before the call that fixed the slot, `between(expected_s)` is the
    range a wait reported afterwards must fall in: no longer than the slot's offset, no shorter
    than that less the time this test has taken since (and a millisecond for rounding to µs).
    """

    ROUNDING_S = 0.001

    def __init__(self) -> None:
        self.started = time.monotonic()

    def between(self, expected_s: float) -> tuple[float, float]:
        elapsed_s = time.monotonic() - self.started
        return (expected_s - elapsed_s - self.ROUNDING_S, expected_s + self.ROUNDING_S)

    def holds(self, wait_s: float, expected_s: float) -> bool:
        low, high = self.between(expected_s)
        return low <= wait_s <= high
