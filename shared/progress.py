"""Progress for a person watching a crawl: a live line on a terminal, a plain line every so
often anywhere else (a CI log, a file, a pipe), in the way Scrapy logs its stats.

`ProgressDisplay` draws with rich on a terminal and prints plain lines otherwise; what it shows
is formatted here from a `Snapshot` of the run, by functions that know nothing of terminals,
so that they can be checked with figures alone.
"""

from __future__ import annotations

import collections
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

RATE_WINDOW_S = 30.0  # the pages/s shown is the average over this much of the recent past
EVERY_S = 10.0  # seconds between plain lines


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic seconds
    total: int  # URLs the run has enqueued so far
    stored: int
    dead: int
    skipped: int
    queued: int | None = None  # ready messages in the work queues; None when unknown
    producing: bool = False  # the producer is still publishing: the total may still grow

    @property
    def done(self) -> int:
        return self.stored + self.dead + self.skipped


class Rate:
    """URLs accounted for per second, over the snapshots of the last `window_s` seconds."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self._window_s = window_s
        self._points: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, snapshot: Snapshot) -> float:
        """Record a snapshot; return the rate as of it."""
        self._points.append((snapshot.at, snapshot.done))
        while len(self._points) > 2 and self._points[1][0] <= snapshot.at - self._window_s:
            self._points.popleft()
        return self.per_s()

    def per_s(self) -> float:
        if len(self._points) < 2:
            return 0.0
        (t0, done0), (t1, done1) = self._points[0], self._points[-1]
        return max(0.0, (done1 - done0) / (t1 - t0)) if t1 > t0 else 0.0


def eta_s(snapshot: Snapshot, rate_per_s: float) -> float | None:
    """Seconds until the URLs enqueued so far are all accounted for at this rate; None when
    nothing is moving."""
    left = snapshot.total - snapshot.done
    if left <= 0:
        return None if snapshot.producing else 0.0  # nothing known yet, or nothing left
    if rate_per_s <= 0:
        return None
    return left / rate_per_s


def duration(seconds: float | None) -> str:
    """45s, 3m05s, 2h04m; "--" for unknown."""
    if seconds is None:
        return "--"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _eta(snapshot: Snapshot, rate_per_s: float) -> str:
    # While the producer still publishes the total grows, and the ETA is a lower bound.
    return (">" if snapshot.producing else "") + duration(eta_s(snapshot, rate_per_s))


def _queued(snapshot: Snapshot) -> str:
    return "?" if snapshot.queued is None else str(snapshot.queued)


def live_detail(snapshot: Snapshot, rate_per_s: float) -> str:
    """What follows the bar and done/total on the live line."""
    return (
        f"{rate_per_s:.1f} pages/s  ETA {_eta(snapshot, rate_per_s)}  dead {snapshot.dead}  "
        f"skipped {snapshot.skipped}  queued {_queued(snapshot)}"
        + ("  (enqueuing)" if snapshot.producing else "")
    )


def periodic_line(snapshot: Snapshot, rate_per_s: float) -> str:
    """The plain line for a log, e.g. "stored 120 (600 pages/min), dead 3, skipped 0; 123 of
    300 done (41%), 177 queued, ETA 17s"."""
    percent = 100 * snapshot.done // snapshot.total if snapshot.total else 0
    return (
        f"stored {snapshot.stored} ({rate_per_s * 60:.0f} pages/min), dead {snapshot.dead}, "
        f"skipped {snapshot.skipped}; {snapshot.done} of {snapshot.total} done ({percent}%)"
        f"{', still enqueuing' if snapshot.producing else ''}, {_queued(snapshot)} queued, "
        f"ETA {_eta(snapshot, rate_per_s)}"
    )


class ProgressDisplay:
    """`show()` as often as you like: on a terminal the live line is redrawn (by rich, a few
    times a second); elsewhere a plain line is printed at most every `every_s` seconds.
    `note()` prints a line of its own, above the live line on a terminal."""

    def __init__(
        self,
        out: IO[str],
        label: str,
        *,
        live: bool | None = None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self._console = Console(file=out, highlight=False)
        self.live = self._console.is_terminal if live is None else live
        self._label = label
        self._every_s = every_s
        self._clock = clock
        self._last_line_at = clock()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._rerouted: list[tuple[logging.StreamHandler[IO[str]], IO[str]]] = []

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                console=self._console,
                refresh_per_second=4,
            )
            before = (sys.stdout, sys.stderr)
            self._progress.start()
            self._task = self._progress.add_task(self._label, total=None, detail="starting")
            self._route_logging(before)
        return self

    def _route_logging(self, before: tuple[IO[str], IO[str]]) -> None:
        """Log lines bound for our terminal go through rich while the live line is up, which
        prints them above it instead of through it. Rich stands in for sys.stdout and
        sys.stderr while live; a logging handler keeps the stream it was given before."""
        for stream, stand_in in zip(before, (sys.stdout, sys.stderr), strict=True):
            if stream is not self._out or stand_in is stream:
                continue
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                    handler.setStream(stand_in)
                    self._rerouted.append((handler, stream))

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            for handler, stream in self._rerouted:
                handler.setStream(stream)
            self._rerouted.clear()
            self._progress.stop()
            self._progress = None

    def show(self, completed: int, total: int | None, detail: str, line: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, total=total, detail=detail)
            return
        if self.live:
            return  # closed
        now = self._clock()
        if now - self._last_line_at >= self._every_s:
            self._last_line_at = now
            print(f"  ... {line}", file=self._out, flush=True)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False)
        else:
            print(text, file=self._out, flush=True)
