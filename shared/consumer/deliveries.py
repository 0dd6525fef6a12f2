"""What a service and the consumer loop (shared/consumer/runtime.py) hand each other: the queues to
consume (`Subscription`), each message (`Delivery`), what to do with it (`Outcome`), the
function that decides (`Handler`) and the flag that stops the loop (`StopEvent`).

Apart from the loop because a service's handler, and its tests, deal in these values alone:
the loop's threads, its connection and its timer heap are none of their business.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.amqp import broker


class StopEvent(threading.Event):
    """The stop flag of a consumer. Setting it also wakes the connection's thread, which sleeps
    inside pika rather than on the flag, so that a stop is seen at once and no thread has to
    wake on a timer to look at the flag."""

    def __init__(self) -> None:
        super().__init__()
        self._on_set: list[Callable[[], None]] = []

    def when_set(self, wake: Callable[[], None]) -> None:
        """Call `wake` on each set() from now on (on the setting thread)."""
        self._on_set.append(wake)

    def set(self) -> None:
        super().set()
        for wake in list(self._on_set):
            wake()


@dataclass(frozen=True)
class Delivery:
    queue: str
    body: bytes
    headers: Mapping[str, Any]
    redelivered: bool
    priority: int = 0
    memo: Any = field(default=None, compare=False)  # what the handler asked to hold it with


@dataclass(frozen=True)
class Outcome:
    """What to do with a delivery: publish these (confirmed), then ack — or reject."""

    publications: tuple[broker.Publication, ...] = ()
    ack: bool = True
    requeue: bool = False
    report: concurrent.futures.Future[Any] | None = None  # see `back_when`
    hold_s: float | None = None  # see `hold`
    memo: Any = None

    @classmethod
    def done(cls) -> Outcome:
        return cls()

    @classmethod
    def forward(cls, *publications: broker.Publication) -> Outcome:
        return cls(publications=publications)

    @classmethod
    def reject(cls, requeue: bool) -> Outcome:
        return cls(ack=False, requeue=requeue)

    @classmethod
    def hold(cls, seconds: float, memo: Any = None) -> Outcome:
        """Not settled: keep the message unacked here and hand it to the handler again in
        `seconds`, with `memo` as its Delivery.memo."""
        return cls(ack=False, hold_s=seconds, memo=memo)

    @classmethod
    def back_when(cls, report: concurrent.futures.Future[Any], memo: Any) -> Outcome:
        """Not settled yet: keep the message unacked here and hand it to the handler again,
        with `memo` as its Delivery.memo, once `report` is done (resolved on any thread, as
        the worker's database writer reports a row's commit). The handler's thread goes on to
        its next message meanwhile, and the handler decides the outcome when the message comes
        back, even once the service is stopping. That decision runs on the connection's thread,
        where pika waits for it: it must not wait on anything (the worker's reads the report,
        counts a metric and queues a mark), and a ServiceUnavailable from it sends the message
        back to its queue."""
        return cls(ack=False, report=report, memo=memo)


@dataclass(frozen=True)
class ConsumerHooks:
    """What a service may add to the loop, each optional."""

    # On the connection's thread, as each message comes: a hold outcome keeps it in the timer
    # heap before any handler thread wakes for it (a worker's URL whose domain is already
    # waiting here); None hands it to the handler threads.
    park: Callable[[Delivery], Outcome | None] | None = None
    # On a handler thread that finds no message waiting, before it waits for one.
    when_idle: Callable[[], None] | None = None
    # On the handler thread that finds nothing else in hand (no message waiting or held, no
    # other thread handling one): what waits on another thread then waits for nothing.
    when_quiet: Callable[[], None] | None = None
    # Once, after the signal handlers are set and before the first connect.
    on_start: Callable[[], None] | None = None


@dataclass(frozen=True)
class Subscription:
    queue: str
    consumer_priority: int = 0  # the broker offers messages to higher-priority consumers first


Handler = Callable[[Delivery], Outcome]
