"""A per-run mark of URLs already settled, so a second copy of a task is not fetched again, and
a count of the messages the broker got from producers.

The producer may publish a URL twice: after a kill -9 it cannot know whether the broker got a
publish whose confirm never came back, and the next run publishes it again (producer/dedup.py).
Each URL has a field in the run's dedup hash, Keys.seen(run, bucket), which the producer sets
to 'c' once the broker confirms the URL. A worker sets it to 'h' once the URL's page row is
committed or its skip recorded, and before fetching it looks the field up: a task whose URL
is already 'h' is acked as a counted no-op instead of being fetched and stored a second time.

The same call (one script, one round trip) counts the delivery in the run's counters by kind:

    copy         a producer's message delivered for the first time: no headers of ours (every
                 copy a worker forwards carries them) and not `redelivered`. Counted as
                 `copies_received` whatever the field says: once the run is drained, the sum
                 is what the broker received from producers, second copies included.
    redelivered  the same broker message again (a worker died or lost its connection holding
                 it). A producer's message counts as `copies_redelivered`: its first delivery
                 was counted only if a worker got as far as this check before it was lost.
    forwarded    a retry, deferral or held copy a worker published: counts nothing.

and a URL already settled as `duplicate_deliveries` (all kinds) and
`duplicate_deliveries.<kind>`: a second copy the producer published is told apart from a
redelivery of one message.

A URL held in the worker for its domain's next slot (worker/handling/waits.py) is checked again
before it is fetched (worker/handling/settled.py), counting nothing unless it is settled: one HGET,
read ahead so that it rides in the round trip that clears the send.

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
import redis.cluster

from shared import metrics
from shared.messages import CrawlTask
from shared.redis.deferred_writes import read_ahead
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.urls import fingerprint

log = logging.getLogger("worker.handled")  # the name operators know: kept as the module moved

HANDLED = b"h"
BUCKET_BYTES = 2  # as producer/dedup.py splits a fingerprint into its hash and field
MARKS_PER_ROUND_TRIP = 500
DUPLICATES_COUNTER = "duplicate_deliveries"
COPIES_RECEIVED = "copies_received"
COPIES_REDELIVERED = "copies_redelivered"
COPY, REDELIVERED, FORWARDED = "copy", "redelivered", "forwarded"
DELIVERY_KINDS = (COPY, REDELIVERED, FORWARDED)

# KEYS[1] the URL's dedup hash, KEYS[2] the run's stats hash; ARGV[1] the URL's field,
# ARGV[2] the delivery's kind, ARGV[3] 1 when it is a producer's message (no headers of ours).
# Returns 1 when the URL is settled already. Atomic, so a count and its verdict go together.
CHECK_SCRIPT = """
local handled = redis.call('HGET', KEYS[1], ARGV[1]) == 'h'
local kind = ARGV[2]
if kind == 'copy' then
  redis.call('HINCRBY', KEYS[2], 'copies_received', 1)
elseif kind == 'redelivered' and ARGV[3] == '1' then
  redis.call('HINCRBY', KEYS[2], 'copies_redelivered', 1)
end
if handled then
  redis.call('HINCRBY', KEYS[2], 'duplicate_deliveries', 1)
  redis.call('HINCRBY', KEYS[2], 'duplicate_deliveries.' .. kind, 1)
  return 1
end
return 0
"""
CLOSE_WAIT_S = 5.0
_STOP = ("", b"")  # put by close(): the writer sends what it holds and ends


def delivery_kind(headers: object, redelivered: bool) -> str:
    """COPY, REDELIVERED or FORWARDED (see the module docstring). The producer publishes without
    headers; every copy a worker forwards carries its progress headers."""
    if redelivered:
        return REDELIVERED
    return FORWARDED if headers else COPY


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
        self._check = client.register_script(CHECK_SCRIPT)  # EVALSHA, reloaded on NOSCRIPT
        # On a Redis Cluster the dedup bucket and the run's counters live in different slots,
        # which no one script may touch: there the check reads the mark alone and the counters
        # follow as commands of their own (not atomic with it; they are figures, not state).
        self._on_cluster = isinstance(client, redis.cluster.RedisCluster)
        for kind in DELIVERY_KINDS:  # each series from 0, so increase() sees the first one
            metrics.DUPLICATE_DELIVERIES.labels(kind)

    def already_handled(
        self, task: CrawlTask, kind: str = FORWARDED, from_producer: bool = False, counted: bool = False
    ) -> bool:
        """True when another copy of this task's URL was settled before. Counts the delivery by
        `kind` (delivery_kind()) unless it was `counted` before (a URL back from a hold in the
        worker: the same delivery); `from_producer`: the message is as a producer published it."""
        key, field = seen_field(self._keys, task.run_id, task.url)
        with translate_redis_errors(self._client):
            if self._on_cluster or counted:
                handled = self._check_in_commands(key, field, task.run_id, kind, from_producer, counted)
            else:
                handled = bool(
                    self._check(
                        keys=[key, self._keys.run_stats(task.run_id)],
                        args=[field, kind, 1 if from_producer else 0],
                    )
                )
        if kind == COPY and not counted:
            metrics.PRODUCER_COPIES_RECEIVED.inc()
        if handled:
            metrics.DUPLICATE_DELIVERIES.labels(kind).inc()
        return handled

    def read_ahead(self, task: CrawlTask) -> None:
        """Have the mark of a URL back from a hold read with this thread's next Redis command
        (the clearance of its send, ordinarily), for already_handled(task, counted=True) to
        answer without a round trip of its own (shared/redis/deferred_writes.py)."""
        read_ahead(self._client, "HGET", *seen_field(self._keys, task.run_id, task.url))

    def _check_in_commands(
        self, key: str, field: bytes, run_id: str, kind: str, from_producer: bool, counted: bool
    ) -> bool:
        """CHECK_SCRIPT's work as separate commands: on a cluster (see __init__), and for a
        delivery counted before, whose check counts nothing unless the URL is settled: then
        it is one read, which may have gone ahead (read_ahead)."""
        handled = self._client.hget(key, field) in (HANDLED, HANDLED.decode())  # bytes or decoded
        stats = self._keys.run_stats(run_id)
        if not counted and kind == COPY:
            self._client.hincrby(stats, "copies_received", 1)
        elif not counted and kind == REDELIVERED and from_producer:
            self._client.hincrby(stats, "copies_redelivered", 1)
        if handled:
            self._client.hincrby(stats, "duplicate_deliveries", 1)
            self._client.hincrby(stats, f"duplicate_deliveries.{kind}", 1)
        return handled

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
