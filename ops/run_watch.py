"""Where a run stands, asked several times a second by `ops.crawl` while it waits.

The total comes from the run's counters in Redis, which every producer invocation of the run
adds to as its publishes are confirmed: a crawl started again with the same run id waits for
the whole run, not only what its own producer published. Outcomes come from PostgreSQL over
one connection kept open (ops.accounting.Tally), queue depths from passive declares.

A blip of Redis or PostgreSQL does not end the crawl being watched: the workers wait for the
service by themselves, and so does the watch. `snapshot_if_reachable()` answers None while
either cannot be asked (progress shows "?"), reconnects at the next call, and gives up with
one line (CrawlFailed) only once they have stayed away OUTAGE_LIMIT_S.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from types import TracebackType

import pika
import redis

from ops.accounting import Tally
from ops.crawl_processes import CrawlFailed
from shared.amqp import broker
from shared.amqp.topology import build_topology, discovery_queue
from shared.errors import ServiceUnavailable, one_line
from shared.message_bounds import TASK_KINDS
from shared.progress import Snapshot
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import frontier_holds_a_page, read_state, recorded_counters, recorded_enqueued
from shared.settings import Settings

OUTAGE_LIMIT_S = 120.0
# What a lost Redis or PostgreSQL raises here (PostgreSQL's arrives translated by shared.postgres.db).
WATCH_ERRORS = (ServiceUnavailable, redis.exceptions.RedisError)


class RunWatch:
    def __init__(
        self,
        settings: Settings,
        run_id: str,
        *,
        outage_limit_s: float = OUTAGE_LIMIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._outage_limit_s = outage_limit_s
        self._clock = clock
        self._unreachable_since: float | None = None
        self.unreachable = ""  # why the last snapshot_if_reachable() answered None
        self._settings = settings
        self._run_id = run_id
        self._keys = Keys(settings.redis_prefix)
        self._redis = connect_redis(settings, OPERATOR)
        self._tally = Tally(settings, run_id)
        self._connection: pika.BlockingConnection | None = None
        self._queues = build_topology(settings).work_queues()

    def state(self) -> str:
        return read_state(self._redis, self._keys, self._run_id)

    def total(self) -> int:
        return recorded_enqueued(self._redis, self._keys, self._run_id)

    def counters(self) -> dict[str, int]:
        """The run's numeric counters (shared/redis/keys.py: the run's stats hash)."""
        return recorded_counters(self._redis, self._keys, self._run_id)

    def enqueued_by_queue(self) -> dict[str, int]:
        stats: dict[bytes, bytes] = self._redis.hgetall(self._keys.run_stats(self._run_id))  # type: ignore[assignment]
        found = {k.decode(): int(v) for k, v in stats.items() if k.startswith(b"enqueued.")}
        return {kind: found[f"enqueued.{kind}"] for kind in TASK_KINDS if f"enqueued.{kind}" in found}

    def snapshot(self, producing: bool = False) -> Snapshot:
        stored, dead, skipped = self._tally.outcomes()
        return Snapshot(time.monotonic(), self.total(), stored, dead, skipped, self.queued(), producing)

    def snapshot_if_reachable(self, producing: bool = False) -> Snapshot | None:
        """A snapshot, or None while Redis or PostgreSQL cannot be asked (`unreachable` says
        why); raises CrawlFailed once they have been away for `outage_limit_s`."""
        try:
            found = self.snapshot(producing)
        except WATCH_ERRORS as exc:
            now = self._clock()
            if self._unreachable_since is None:
                self._unreachable_since = now
            self.unreachable = one_line(exc)
            if now - self._unreachable_since >= self._outage_limit_s:
                raise CrawlFailed(
                    f"progress could not be read for {self._outage_limit_s:.0f} s: {self.unreachable}"
                ) from None
            return None
        self._unreachable_since = None
        self.unreachable = ""
        return found

    def queued(self) -> int | None:
        """Ready messages in the work queues (of every run in this namespace); None when the
        broker cannot be asked right now."""
        try:
            if self._connection is None or not self._connection.is_open:
                self._connection = broker.connect(self._settings, "crawl progress")
            channel = self._connection.channel()
            try:
                return sum(broker.queue_depth(channel, queue)[0] for queue in self._queues)
            finally:
                channel.close()
        except Exception:  # only progress figures: a missing one is shown as "?"
            self._forget_connection()
            return None

    def links_waiting(self) -> int | None:
        """Ready messages in the discovery queue (links of stored pages, for the frontier), and
        one more while a frontier holds a page of this run (a page it takes is no longer ready,
        and its links are not yet enqueued); None when the broker or Redis cannot be asked now."""
        try:
            if frontier_holds_a_page(self._redis, self._keys, self._run_id):
                return 1
        except redis.exceptions.RedisError:
            return None
        try:
            if self._connection is None or not self._connection.is_open:
                self._connection = broker.connect(self._settings, "crawl progress")
            channel = self._connection.channel()
            try:
                return broker.queue_depth(channel, discovery_queue(self._settings.crawl_namespace))[0]
            finally:
                channel.close()
        except Exception:  # the crawl asks again at its next poll
            self._forget_connection()
            return None

    def _forget_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def close(self) -> None:
        self._forget_connection()
        self._tally.close()
        self._redis.close()

    def __enter__(self) -> RunWatch:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
