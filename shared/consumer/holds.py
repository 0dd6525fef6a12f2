"""Messages a service keeps unacked while they wait, each handed back to a handler when due.

A handler that cannot finish a message yet, but will be able to within a known, short time (the
worker's URL whose domain slot is reserved a few seconds ahead), returns `Outcome.hold(s)`. The
message stays unacked in this process, so a crash gives it back to the broker like any other
unsettled message, and the handler's thread goes on to other messages meanwhile. Bouncing it
through a delay queue instead costs a publish, a confirm, a dead-lettering and a delivery per
bounce, and a waiting URL bounced every second.

`HeldMessages` is the timer heap, free of threads and clocks of its own: the consumer's timer
thread asks it what is due and how long to sleep.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class HeldMessages(Generic[T]):
    """Items due at given times; thread-safe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()  # ties keep their order, and items are never compared
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self._woken = False  # a wake() that the timer thread has not yet seen

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)

    def hold(self, item: T, delay_s: float) -> None:
        with self._lock:
            due = self._clock() + max(0.0, delay_s)
            earliest = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, next(self._seq), item))
            if earliest:  # the timer thread sleeps towards a later item: wake it
                self.changed.notify()

    def take_due(self) -> list[T]:
        """Every item whose time has come, earliest first."""
        with self._lock:
            now = self._clock()
            due = []
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[2])
            return due

    def take_all(self) -> list[T]:
        """Everything, due or not (the service is stopping and gives them back)."""
        with self._lock:
            items = [entry[2] for entry in sorted(self._heap)]
            self._heap.clear()
            return items

    def wake(self) -> None:
        """End a `wait_for_next` now (the service is stopping). A wake that comes while the timer
        thread is between two waits ends its next one at once: the timer sleeps with no bound
        when nothing is held, so a lost wake would leave it asleep for good."""
        with self._lock:
            self._woken = True
            self.changed.notify_all()

    def wait_for_next(self, longest_s: float | None = None) -> None:
        """Sleep until the earliest item is due, an earlier one is added, `wake` is called, or
        `longest_s` (if given) passes."""
        with self._lock:
            if not self._woken:
                delay = longest_s
                if self._heap:
                    due_in = self._heap[0][0] - self._clock()
                    delay = due_in if delay is None else min(delay, due_in)
                if delay is None or delay > 0:
                    self.changed.wait(delay)
            self._woken = False
