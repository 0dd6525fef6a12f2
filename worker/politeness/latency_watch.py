"""Rising latency as a sign that a domain is overloaded, seen from one worker process.

Each answer's time updates a moving average per domain, and a baseline: the lowest the average
has been, drifting up slowly so that a site that is simply slower now becomes the new normal.
When the average is more than LATENCY_RISE times the baseline (and LATENCY_FLOOR_S above it,
so the jitter of fast pages means nothing), the domain is slowing down under our requests: the
gate then cuts its shared rate (worker/politeness/ratelimit.py), at most once every LATENCY_SAMPLES answers
of this process, so that the answers already on their way cannot cut it again and again.
The decision to slow down is local, the cut is shared: every worker then sends at the lower rate.
Scrapy's AutoThrottle reads the same signal differently: it sets the delay to the latency
divided by a target concurrency; here the latency only triggers the same cut a 429 does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

SMOOTHING = 0.2  # weight of the newest answer in the moving average
BASELINE_DRIFT = 0.01  # how fast the baseline follows an average above it, per answer
LATENCY_RISE = 2.0
LATENCY_FLOOR_S = 0.05
LATENCY_SAMPLES = 10  # answers before a domain is judged, and between two slow-downs
MAX_DOMAINS = 10_000  # domains remembered; the oldest are forgotten beyond


@dataclass
class _Domain:
    average_s: float
    baseline_s: float
    answers: int = 1
    quiet: int = LATENCY_SAMPLES  # answers to wait before judging again


class LatencyWatch:
    def __init__(self) -> None:
        self._domains: dict[str, _Domain] = {}
        self._lock = threading.Lock()

    def rising(self, domain: str, seconds: float) -> bool:
        """Count one answer's time; True when the domain should slow down now."""
        with self._lock:
            state = self._domains.get(domain)
            if state is None:
                if len(self._domains) >= MAX_DOMAINS:
                    self._domains.pop(next(iter(self._domains)))
                self._domains[domain] = _Domain(seconds, seconds)
                return False
            state.answers += 1
            state.average_s += SMOOTHING * (seconds - state.average_s)
            if state.average_s < state.baseline_s:
                state.baseline_s = state.average_s
            else:
                state.baseline_s += BASELINE_DRIFT * (state.average_s - state.baseline_s)
            state.quiet = max(0, state.quiet - 1)
            if state.quiet or state.answers < LATENCY_SAMPLES:
                return False
            if (
                state.average_s > LATENCY_RISE * state.baseline_s
                and state.average_s - state.baseline_s > LATENCY_FLOOR_S
            ):
                state.quiet = LATENCY_SAMPLES
                return True
            return False
