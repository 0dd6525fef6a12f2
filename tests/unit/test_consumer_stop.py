"""A stop reaches every thread of the consumer at once, though each sleeps with no timer to look
at the stop flag: the connection's thread in pika for up to POLL_S, the others until woken."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable

from shared.consumer import POLL_S, ConsumerRuntime, Outcome, StopEvent
from shared.settings import Settings


class SleepingLink:
    """A connection and its channel whose process_data_events sleeps as pika's does: until a
    callback is added from another thread, or the time limit passes."""

    consumer_tags: tuple[str, ...] = ()
    is_open = True

    def __init__(self) -> None:
        self.callbacks: queue.Queue[Callable[[], None]] = queue.Queue()
        self.time_limits: list[float] = []

    def process_data_events(self, time_limit: float) -> None:
        self.time_limits.append(time_limit)
        with contextlib.suppress(queue.Empty):
            self.callbacks.get(timeout=time_limit)()

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self.callbacks.put(callback)

    def close(self) -> None:
        self.is_open = False

    def basic_ack(self, _tag: int) -> None:
        pass


class LinkedRuntime(ConsumerRuntime):
    """A runtime whose connect= opens a SleepingLink: no broker."""

    def __init__(self, stop: StopEvent) -> None:
        self.link = SleepingLink()
        self.connected = threading.Event()
        super().__init__(
            Settings(), "test", [], lambda _d: Outcome.done(), 4, stop_event=stop, connect=self._open
        )

    def _open(self, _settings: Settings, _name: str, _prefetch: int) -> tuple[object, object, object]:
        self.connected.set()
        return self.link, self.link, self.link


def test_a_stop_ends_the_run_at_once_though_the_connection_thread_sleeps_in_pika() -> None:
    stop = StopEvent()
    runtime = LinkedRuntime(stop)
    run = threading.Thread(target=runtime.run, daemon=True)
    run.start()
    assert runtime.connected.wait(5.0)
    time.sleep(0.1)  # into process_data_events, and the handler threads into their waits
    started = time.monotonic()
    stop.set()
    run.join(POLL_S)
    assert not run.is_alive()
    assert time.monotonic() - started < POLL_S / 2
    assert runtime.link.time_limits[0] == POLL_S
    threads = [t for t in threading.enumerate() if t.name.startswith("test-")]
    assert threads == []  # the handler threads and the timer of held messages ended too


def test_a_stop_set_again_or_before_the_run_wakes_nothing_and_breaks_nothing() -> None:
    stop = StopEvent()
    stop.set()
    runtime = LinkedRuntime(stop)
    assert runtime.run() == 0 and not runtime.connected.is_set()
    stop.set()
