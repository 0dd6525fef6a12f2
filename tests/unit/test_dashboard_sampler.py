"""The shared sampler: one sample per interval whatever the number of viewers, latest-wins
queues, per-viewer diffs, and an interval stretched by slow samples."""

from __future__ import annotations

import asyncio
import time

import pytest

from ops.dashboard.sampler import MAX_SCOPES, Hub, Sample, Subscriber, TooManyScopes

pytestmark = pytest.mark.unit


class Counting:
    """A view whose regions change every sample; `took_s` makes each sample slow."""

    def __init__(self, took_s: float = 0.0) -> None:
        self.calls = 0
        self.took_s = took_s

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        time.sleep(self.took_s)
        return {"count": str(self.calls), "fixed": "same"}


def test_five_viewers_cost_one_sample_per_interval() -> None:
    async def scenario() -> tuple[int, list[int], int]:
        hub = Hub(refresh_s=0.05)
        produce = Counting()
        pairs = [hub.subscribe("run:r1", produce) for _ in range(5)]
        sampler = pairs[0][0]
        received = [0] * 5

        async def read(i: int, subscriber: Subscriber) -> None:
            while True:
                await subscriber.pending.get()
                received[i] += 1

        readers = [asyncio.create_task(read(i, s)) for i, (_, s) in enumerate(pairs)]
        await asyncio.sleep(0.52)
        for task in readers:
            task.cancel()
        for _, subscriber in pairs:
            sampler.unsubscribe(subscriber)
        return produce.calls, received, len(hub.samplers)

    calls, received, left = asyncio.run(scenario())
    # At most one per 0.05 s over 0.52 s (fewer on a loaded machine), never one per viewer.
    assert 3 <= calls <= 12
    assert all(calls - 1 <= n <= calls for n in received)
    assert left == 0  # the last viewer gone, the sampler stops


def test_a_slow_client_gets_only_the_latest_sample() -> None:
    subscriber = Subscriber()
    for n in range(3):
        subscriber.offer(Sample({"r": str(n)}, 0.0, 1.0))
    assert subscriber.pending.qsize() == 1
    assert subscriber.pending.get_nowait().regions == {"r": "2"}


def test_each_viewer_is_sent_what_changed_for_it() -> None:
    first, late = Subscriber(), Subscriber()
    one = Sample({"a": "1", "b": "x"}, 0.0, 1.0)
    two = Sample({"a": "2", "b": "x"}, 0.0, 1.0)
    assert first.changes(one) == {"a": "1", "b": "x"}
    assert first.changes(two) == {"a": "2"}
    assert first.changes(two) == {}
    assert late.changes(two) == {"a": "2", "b": "x"}  # a new viewer gets every region


def test_slow_samples_stretch_the_interval() -> None:
    async def scenario() -> float:
        hub = Hub(refresh_s=0.01)
        sampler, subscriber = hub.subscribe("overview", Counting(took_s=0.03))
        await subscriber.pending.get()
        interval = sampler.interval_s
        sampler.unsubscribe(subscriber)
        return interval

    assert asyncio.run(scenario()) >= 0.3


def test_a_failing_view_reports_one_line_and_keeps_its_last_regions() -> None:
    def failing() -> dict[str, str]:
        raise RuntimeError("cannot reach PostgreSQL at postgresql://u:secret@db/x: refused\nmore")

    async def scenario() -> Sample:
        hub = Hub(refresh_s=1)
        sampler, subscriber = hub.subscribe("queues", failing)
        sample = await subscriber.pending.get()
        sampler.unsubscribe(subscriber)
        return sample

    sample = asyncio.run(scenario())
    assert sample.regions == {}
    assert sample.error == "cannot reach PostgreSQL at postgresql://u:***@db/x: refused"


def test_scopes_are_bounded_and_shared() -> None:
    async def scenario() -> None:
        hub = Hub(refresh_s=10)
        made = [hub.subscribe(f"run:{n}", Counting()) for n in range(MAX_SCOPES)]
        same, _ = hub.subscribe("run:0", Counting())
        assert same is made[0][0]
        with pytest.raises(TooManyScopes):
            hub.subscribe("run:new", Counting())
        for sampler, subscriber in made:
            sampler.unsubscribe(subscriber)
        await asyncio.sleep(0)

    asyncio.run(scenario())
