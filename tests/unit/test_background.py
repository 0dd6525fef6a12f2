"""The pipeline's background thread: calls run in order, and no error is lost."""

from __future__ import annotations

import functools
import threading

import pytest

from producer.background import Background
from shared.errors import ServiceUnavailable


def test_calls_run_one_at_a_time_in_the_order_given() -> None:
    ran: list[int] = []
    gate = threading.Event()
    background = Background("test")
    try:
        first = background.call(lambda: gate.wait(5))  # holds up everything after it
        for n in range(5):
            background.call_unwatched(functools.partial(ran.append, n))
        last = background.call(lambda: list(ran))
        assert ran == []
        gate.set()
        assert first.result() is True
        assert last.result() == [0, 1, 2, 3, 4]
        background.finish()
    finally:
        background.close()


def test_an_unwatched_error_is_raised_by_a_later_check_or_by_finish() -> None:
    def fail() -> None:
        raise ServiceUnavailable("Redis", "127.0.0.1", "Connection refused")

    background = Background("test")
    try:
        background.call_unwatched(fail)
        background.call(lambda: None).result()  # the failed call has run by now
        with pytest.raises(ServiceUnavailable):
            background.check()
        background.check()  # raised once, not again

        background.call_unwatched(fail)
        with pytest.raises(ServiceUnavailable):
            background.finish()
    finally:
        background.close()
