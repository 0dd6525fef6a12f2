"""The consumer loop's local buffer (shared/consumer/runtime.py): the messages received and not yet
handled, between the connection's thread that puts them in and the handler threads that take
them out.

A `LocalItem` is a delivery as the loop keeps it, here or in the timer heap of held messages:
ordered by its subscription's rank (the highest consumer priority first), then by message
priority (the highest first), then by arrival; and carrying the connection generation and
delivery tag it is settled by. Apart from the loop because every side of it uses these: the
connection's thread, the handler threads and the timer thread.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from shared.consumer.deliveries import Delivery


@dataclass(order=True)
class LocalItem:
    rank: int
    priority: int
    seq: int
    generation: int = field(compare=False)
    tag: int = field(compare=False)
    delivery: Delivery = field(compare=False)
    parked: bool = field(default=False, compare=False)  # held as it came, before any handling


class LocalQueue(queue.PriorityQueue[LocalItem]):
    def put_together(self, items: list[LocalItem]) -> None:
        """Queue `items` and wake one handler thread for them all: it takes them back to back,
        as threads do that find a message waiting when they finish one."""
        with self.not_empty:
            for item in items:
                self._put(item)
            self.unfinished_tasks += len(items)
            self.not_empty.notify()
