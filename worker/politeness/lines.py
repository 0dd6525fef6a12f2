"""Threads of one process taking turns, one line per key (a domain).

    with lines.turn(key, timeout_s) as turn:   # AT_ONCE, AFTER_OTHERS or MISSED
        ...                                     # the head of the line, unless MISSED

Used where a thread's work for a domain makes the same work of the threads behind it
unnecessary or useless, so they wait instead of doing it too: asking the shared limiter for a
busy domain's concurrency slot (worker/politeness/gate.py), reading a domain's robots.txt rules
(worker/politeness/robots.py). A line lives while someone is in it, so a crawl of many domains keeps no
lock for each.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


class Turn(enum.Enum):
    MISSED = "missed"  # the caller's wait ran out in the line
    AT_ONCE = "at once"  # nobody was ahead
    AFTER_OTHERS = "after others"  # waited for the threads ahead; they may have done the work


class Lines:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._lines: dict[str, _Line] = {}

    @contextlib.contextmanager
    def turn(self, key: str, timeout_s: float) -> Iterator[Turn]:
        """The head of `key`'s line until the block ends, or MISSED after `timeout_s`."""
        with self._guard:
            line = self._lines.get(key)
            if line is None:
                line = self._lines[key] = _Line()
            line.waiting += 1
        got = line.head.acquire(blocking=False)
        turn = Turn.AT_ONCE if got else Turn.MISSED
        if not got and timeout_s > 0:
            got = line.head.acquire(timeout=timeout_s)
            turn = Turn.AFTER_OTHERS if got else Turn.MISSED
        try:
            yield turn
        finally:
            if got:
                line.head.release()
            with self._guard:
                line.waiting -= 1
                if line.waiting == 0:
                    del self._lines[key]


@dataclass
class _Line:
    head: threading.Lock = field(default_factory=threading.Lock)
    waiting: int = 0
