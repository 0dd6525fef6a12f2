"""One thread for the pipeline's dedup calls, so that it can read and publish while Redis works.

Each dedup call is a round trip to Redis, which runs a script over the whole batch: in a 100,000
URL run the pipeline spent about a quarter of its time waiting on them. Calls given here run one
at a time, in the order given (so a batch's claim still comes after the marks before it). The
caller waits for a result only when it needs one; errors of calls whose result nobody waits for
are raised at the next check instead of lost.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Background:
    def __init__(self, name: str) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self._unwatched: collections.deque[concurrent.futures.Future[object]] = collections.deque()

    def call(self, function: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Start `function`; the caller waits for its result (and error) through the future."""
        return self._executor.submit(function)

    def call_unwatched(self, function: Callable[[], object]) -> None:
        """Start `function`; nobody waits for it, but an error it raises is raised by a later
        `check` or by `finish`."""
        self._unwatched.append(self._executor.submit(function))

    def check(self) -> None:
        """Raise the error of an unwatched call that has failed, if one has."""
        while self._unwatched and self._unwatched[0].done():
            self._unwatched.popleft().result()

    def finish(self) -> None:
        """Wait for every unwatched call; raise the first error among them once all are done,
        so that none is left to the next user of these threads."""
        first: BaseException | None = None
        while self._unwatched:
            error = self._unwatched.popleft().exception()
            first = first or error
        if first is not None:
            raise first

    def close(self) -> None:
        """Wait for whatever runs or waits to run, then end the thread."""
        self._executor.shutdown(wait=True)
