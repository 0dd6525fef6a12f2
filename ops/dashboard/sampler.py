"""One sampler per scope, shared by every viewer of it, so that N open pages cost what one does.

A scope is what one kind of page shows live ("overview", "run:<id>", "queues", "workers",
"dead-letters:<filter>"). Its sampler runs only while someone is subscribed: each tick it
computes the scope's regions (rendered HTML fragments, by id) in a worker thread, since the
project's clients are synchronous, and offers them to every subscriber. A subscriber holds at
most one pending sample (latest wins), so a slow client skips samples and never slows the
sampler; what it is sent is diffed against what it was last sent, which makes up for what it
skipped. The interval is DASHBOARD_REFRESH_S, stretched to ten times the last sample's duration,
so a slow database is asked at most a tenth of the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from ops.dashboard.text import short_error
from shared.errors import PipelineError

log = logging.getLogger(__name__)

Regions = dict[str, str]
Produce = Callable[[], Regions]
MAX_SCOPES = 20
STRETCH = 10.0  # the interval is at least this many times the last sample's duration


class TooManyScopes(PipelineError):
    """More distinct live views than MAX_SCOPES at once."""


@dataclass
class Sample:
    regions: Regions
    at: float  # wall-clock time it was taken
    interval_s: float
    error: str | None = None


@dataclass(eq=False)  # held in a set, by identity
class Subscriber:
    pending: asyncio.Queue[Sample] = field(default_factory=lambda: asyncio.Queue(maxsize=1))
    sent: Regions = field(default_factory=dict)

    def offer(self, sample: Sample) -> None:
        if self.pending.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.pending.get_nowait()  # latest wins
        self.pending.put_nowait(sample)

    def changes(self, sample: Sample) -> Regions:
        """The regions that differ from what this subscriber was last sent; remembers them sent."""
        changed = {k: v for k, v in sample.regions.items() if self.sent.get(k) != v}
        self.sent.update(changed)
        return changed


class Sampler:
    def __init__(
        self, scope: str, produce: Produce, refresh_s: float, on_empty: Callable[[str], None]
    ) -> None:
        self.scope = scope
        self.produce = produce
        self.refresh_s = refresh_s
        self.samples = 0  # samples taken: what the tests and the benchmark count
        self.interval_s = refresh_s
        self.last: Sample | None = None
        self._subscribers: set[Subscriber] = set()
        self._task: asyncio.Task[None] | None = None
        self._on_empty = on_empty

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber()
        self._subscribers.add(subscriber)
        if self.last is not None:
            subscriber.offer(self.last)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sampler {self.scope}")
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)
        if not self._subscribers:
            if self._task is not None:
                self._task.cancel()
            self._on_empty(self.scope)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def sample_once(self) -> Sample:
        started = time.monotonic()
        error = None
        try:
            regions = await anyio.to_thread.run_sync(self.produce)
        except Exception as exc:  # a service that is down shows in the page, and is asked again
            error = short_error(exc)
            regions = {}
        took = time.monotonic() - started
        self.samples += 1
        self.interval_s = max(self.refresh_s, STRETCH * took)
        sample = Sample(regions, time.time(), self.interval_s, error)
        if error is None:
            self.last = sample
        return sample

    async def _run(self) -> None:
        while self._subscribers:
            sample = await self.sample_once()
            for subscriber in list(self._subscribers):
                subscriber.offer(sample)
            await asyncio.sleep(self.interval_s)


class Hub:
    """The samplers of this process, by scope; a scope's sampler exists while it has viewers."""

    def __init__(self, refresh_s: float) -> None:
        self.refresh_s = refresh_s
        self.samplers: dict[str, Sampler] = {}
        self.samples_by_scope: dict[str, int] = {}  # kept after a sampler ends, for the counts

    def subscribe(self, scope: str, produce: Produce) -> tuple[Sampler, Subscriber]:
        sampler = self.samplers.get(scope)
        if sampler is None:
            if len(self.samplers) >= MAX_SCOPES:
                raise TooManyScopes(f"{MAX_SCOPES} live views are open already")
            sampler = Sampler(scope, produce, self.refresh_s, self._ended)
            self.samplers[scope] = sampler
        return sampler, sampler.subscribe()

    def _ended(self, scope: str) -> None:
        sampler = self.samplers.pop(scope, None)
        if sampler is not None:
            self.samples_by_scope[scope] = self.samples_by_scope.get(scope, 0) + sampler.samples

    def figures(self) -> dict[str, Any]:
        return {
            scope: {"subscribers": s.subscribers, "samples": s.samples, "interval_s": round(s.interval_s, 2)}
            for scope, s in self.samplers.items()
        }
