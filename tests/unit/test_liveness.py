from __future__ import annotations

import threading

import pytest
import redis.exceptions

from producer.liveness import Heartbeat


class FakeDedup:
    def __init__(self, failures: int = 0, error: Exception | None = None) -> None:
        self.error = error or redis.exceptions.ConnectionError("gone")
        self.beats = 0
        self.stopped = False
        self.failures = failures
        self.beaten = threading.Event()

    def beat(self) -> None:
        self.beats += 1
        if self.beats > 1 and self.failures:
            self.failures -= 1
            raise self.error
        if self.beats >= 4:
            self.beaten.set()

    def stop_beating(self) -> None:
        self.stopped = True


def test_beats_from_entry_until_exit_through_lost_connections() -> None:
    dedup = FakeDedup(failures=2)
    with Heartbeat(dedup, every_s=0.01):
        assert dedup.beats >= 1  # before the first claim
        assert dedup.beaten.wait(5)
    assert dedup.stopped
    beats = dedup.beats
    threading.Event().wait(0.05)
    assert dedup.beats == beats  # the thread ended with the block


def test_the_heartbeat_is_removed_after_an_error_too() -> None:
    dedup = FakeDedup()
    with pytest.raises(RuntimeError), Heartbeat(dedup, every_s=0.01):
        raise RuntimeError("the run broke")
    assert dedup.stopped


def test_any_redis_error_leaves_the_heartbeat_beating() -> None:
    # Not a lost connection: a Redis that answers, with an error (loading, read-only, OOM).
    dedup = FakeDedup(failures=2, error=redis.exceptions.ResponseError("LOADING Redis is loading"))
    with Heartbeat(dedup, every_s=0.01):
        assert dedup.beaten.wait(5)
    assert dedup.beats >= 4 and dedup.stopped
