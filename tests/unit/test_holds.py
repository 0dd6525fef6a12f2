"""The timer heap of held messages, on a clock that only moves when told."""

from __future__ import annotations

import threading

import pytest

from shared.consumer.holds import HeldMessages
from tests.fakes import FakeTime


def test_nothing_is_due_before_its_time_and_everything_due_comes_out_earliest_first() -> None:
    clock = FakeTime(now=100.0)
    held: HeldMessages[str] = HeldMessages(clock)
    held.hold("late", 5.0)
    held.hold("early", 1.0)
    held.hold("middle", 3.0)
    assert held.take_due() == [] and len(held) == 3
    clock.now += 3.0
    assert held.take_due() == ["early", "middle"]
    clock.now += 10.0
    assert held.take_due() == ["late"] and len(held) == 0


def test_items_due_together_keep_the_order_they_were_held_in() -> None:
    clock = FakeTime(now=100.0)
    held: HeldMessages[dict[str, int]] = HeldMessages(clock)  # items that cannot be compared
    for n in range(5):
        held.hold({"n": n}, 2.0)
    clock.now += 2.0
    assert [item["n"] for item in held.take_due()] == [0, 1, 2, 3, 4]


def test_a_negative_delay_is_due_at_once() -> None:
    held: HeldMessages[str] = HeldMessages(FakeTime(now=100.0))
    held.hold("now", -1.0)
    assert held.take_due() == ["now"]


def test_stopping_takes_everything_due_or_not() -> None:
    clock = FakeTime(now=100.0)
    held: HeldMessages[str] = HeldMessages(clock)
    held.hold("b", 50.0)
    held.hold("a", 10.0)
    assert held.take_all() == ["a", "b"] and held.take_due() == [] and len(held) == 0


def test_the_timer_sleeps_no_longer_than_the_earliest_item_or_the_bound() -> None:
    clock = FakeTime(now=100.0)
    held: HeldMessages[str] = HeldMessages(clock)
    waits: list[float | None] = []

    class RecordingCondition:
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            return False

        def notify(self) -> None:
            pass

    held.changed = RecordingCondition()  # type: ignore[assignment]
    held.wait_for_next(0.25)
    held.hold("x", 0.1)
    held.wait_for_next(0.25)
    clock.now += 1.0
    held.wait_for_next(0.25)  # overdue: no sleep at all
    assert waits == [0.25, pytest.approx(0.1)]


def test_an_earlier_item_wakes_a_sleeping_timer() -> None:
    held: HeldMessages[str] = HeldMessages(lambda: 0.0)
    held.hold("far", 1000.0)
    woke = threading.Event()

    def timer() -> None:
        held.wait_for_next(30.0)
        woke.set()

    thread = threading.Thread(target=timer)
    thread.start()
    try:
        assert not woke.wait(0.2)
        held.hold("near", 0.0)
        assert woke.wait(5.0)
    finally:
        held.hold("stop", -1.0)
        thread.join(5.0)


class RecordingCondition:
    """In place of `changed`: records each sleep's timeout, and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return False

    def notify(self) -> None:
        pass

    def notify_all(self) -> None:
        pass


def test_with_nothing_held_the_timer_sleeps_without_a_bound() -> None:
    held: HeldMessages[str] = HeldMessages(FakeTime(now=100.0))
    held.changed = changed = RecordingCondition()  # type: ignore[assignment]
    held.wait_for_next()
    held.hold("x", 30.0)
    held.wait_for_next()
    assert changed.waits == [None, pytest.approx(30.0)]


def test_a_wake_between_two_waits_ends_the_next_one_at_once_and_only_that_one() -> None:
    held: HeldMessages[str] = HeldMessages(lambda: 0.0)
    held.changed = changed = RecordingCondition()  # type: ignore[assignment]
    held.wake()  # the timer thread is busy elsewhere: the wake is kept for its next wait
    held.wait_for_next()
    assert changed.waits == []  # no sleep at all
    held.wait_for_next()
    assert changed.waits == [None]
