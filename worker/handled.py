"""A per-run mark of URLs already settled, so a second copy of a task is not fetched again.

The producer may publish a URL twice: after a kill -9 it cannot know whether the broker got a
publish whose confirm never came back, and the next run publishes it again (producer/dedup.py).
Each URL has a field in the run's dedup hash, Keys.seen(run, bucket), which the producer sets
to 'c' once the broker confirms the URL. A worker sets it to 'h' once the URL's page row is
committed or its skip recorded, and before fetching it looks the field up: a task whose URL
is already 'h' is acked as a counted no-op (`duplicate_deliveries` in the run's counters)
instead of being fetched and stored a second time.

Not covered, by design: a URL whose outcome is a dead letter (it is marked only once the
recorder has it, which the worker does not see), and two copies handled at the same moment by
two workers. Those fetch again (the store's upsert still keeps one row, the dead-letter
recorder one letter); the extra fetches are bounded by the copies the producer re-published.
A replay of a dead letter by an operator is always fetched.

Marks are written in the background, pipelined in batches: a lost mark costs at most a fetch.
"""

from __future__ import annotations

import logging
import queue
import threading

import redis

from shared.keys import Keys
from shared.messages import CrawlTask
from shared.redis_errors import translate_redis_errors
from shared.urls import fingerprint

log = logging.getLogger(__name__)

HANDLED = b"h"
BUCKET_BYTES = 2  # as producer/dedup.py splits a fingerprint into its hash and field
MARKS_PER_ROUND_TRIP = 500
DUPLICATES_COUNTER = "duplicate_deliveries"
CLOSE_WAIT_S = 5.0
_STOP = ("", b"")  # put by close(): the writer sends what it holds and ends


def seen_field(keys: Keys, run_id: str, url: str) -> tuple[str, bytes]:
    """The dedup hash and field of `url` (canonical, as in a task) in run `run_id`."""
    fp = fingerprint(url)
    return keys.seen(run_id, fp[:BUCKET_BYTES].hex()), fp[BUCKET_BYTES:]


class HandledMarks:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._pending: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False  # close() is final: no writer starts after it

    def already_handled(self, task: CrawlTask) -> bool:
        """True, and counted, when another copy of this task's URL was settled before."""
        key, field = seen_field(self._keys, task.run_id, task.url)
        with translate_redis_errors(self._client):
            if self._client.hget(key, field) != HANDLED:
                return False
            self._client.hincrby(self._keys.run_stats(task.run_id), DUPLICATES_COUNTER, 1)
        return True

    def mark_later(self, task: CrawlTask) -> None:
        """Mark the task's URL handled, soon, from a thread of its own (callable from any).
        After close() the mark is dropped: the Redis client may be gone, and a lost mark costs
        at most one fetch."""
        if self._closed:
            log.debug("handled marks closed: %s not marked", task.url)
            return
        self._pending.put(seen_field(self._keys, task.run_id, task.url))
        if self._thread is None:
            with self._start_lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(
                        target=self._write_marks, name="handled-marks", daemon=True
                    )
                    self._thread.start()

    def close(self) -> None:
        """Send the marks still waiting and stop the writer, before the Redis client closes:
        a writer left running would use the client's pool after its sockets are gone."""
        with self._start_lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._pending.put(_STOP)
            thread.join(CLOSE_WAIT_S)

    def _write_marks(self) -> None:
        stopping = False
        while not stopping:
            marks = [self._pending.get()]
            while len(marks) < MARKS_PER_ROUND_TRIP and not self._pending.empty():
                marks.append(self._pending.get())
            if _STOP in marks:
                stopping = True
                marks = [mark for mark in marks if mark != _STOP]
                if not marks:
                    return
            try:
                with self._client.pipeline(transaction=False) as pipe:
                    for key, field in marks:
                        pipe.hset(key, field, HANDLED)
                    pipe.execute()
            except redis.RedisError as exc:  # a lost mark costs at most one fetch
                log.warning("could not mark %d URLs handled: %s", len(marks), exc)
