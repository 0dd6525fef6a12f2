"""When to start a process again after it died: with a growing pause, and not for ever.

One `RestartPolicy` per supervised process (a worker of a pool, a worker of `ops.crawl`).
Each exit is recorded; the pause before the restart doubles with each exit still inside the
window (0.5 s, 1 s, 2 s, ...), and a process that has ended more than `max_restarts` times
within `window_s` is not started again: it is crashing on something a restart will not fix
(a setting, a service that is gone), and a supervisor should say so rather than spin.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_RESTARTS = 5
WINDOW_S = 60.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 15.0


@dataclass
class RestartPolicy:
    max_restarts: int = MAX_RESTARTS
    window_s: float = WINDOW_S
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    clock: Callable[[], float] = time.monotonic
    _exits: collections.deque[float] = field(default_factory=collections.deque, repr=False)

    def after_exit(self) -> float | None:
        """Record an exit now. Returns the seconds to wait before restarting, or None when the
        process has used up its restarts and must stay stopped."""
        now = self.clock()
        self._exits.append(now)
        while self._exits and self._exits[0] <= now - self.window_s:
            self._exits.popleft()
        if len(self._exits) > self.max_restarts:
            return None
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** (len(self._exits) - 1)))

    @property
    def recent_exits(self) -> int:
        """Exits recorded within the window, as of the last one."""
        return len(self._exits)

    def describe_giving_up(self) -> str:
        return f"ended {self.recent_exits} times within {self.window_s:.0f} s"
