"""A bound on how often one message is delivered: a URL that keeps killing workers ends dead.

A worker that crashes (SIGKILL, out of memory, a segfault in a parser) never settles the
messages it held, so the broker delivers them again with `redelivered` set. That is what we
want for an innocent message, but a message that itself causes the crash would loop forever.
Quorum queues bound this with `x-delivery-limit`; classic queues have nothing alike, so the
worker counts redeliveries itself, in Redis, keyed on a hash of the message:

    deliveries(message) = 1 + redeliveries counted so far

Past `limit` deliveries the message is dead-lettered with reason `delivery_limit`, without
being fetched.

Only a redelivery of a message some worker had *started* handling counts. A worker holds more
messages than it handles at once (prefetch), and when it dies those innocent neighbours come
back redelivered too, and so do the ones waiting for their domain's rate limit; counting them
would dead-letter healthy URLs after a few crashes of other causes. So a handler leaves a
short-lived "handling" marker in Redis while it fetches and parses a message (the part that can
take a worker down), and a redelivery counts only when it finds that marker.

The count is not a failure count (`crawl-attempt` stays as it was): a crash is not the URL's
fault, until it happens `limit` times. Every return of an unsettled message counts, including
the few a worker gives back when it stops, so `limit` must leave room for those. The counter
expires `ttl_s` after the last redelivery, and a Redis restart forgets it: the bound is then
counted afresh, never skipped.
"""

from __future__ import annotations

import hashlib
import logging

import redis

from shared.amqp.broker import Publication
from shared.amqp.topology import POISON_DELIVERY_LIMIT, dead_letter_exchange
from shared.consumer import Delivery, Outcome
from shared.errors import DecodeError
from shared.message_bounds import bounded_body
from shared.messages import REPLAY_HEADER, CrawlTask, Failure, Progress
from shared.redis.deferred_writes import flush, write_later
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys

log = logging.getLogger("worker.poison")  # the name operators know: kept as the module moved

REASON = "delivery_limit"  # the reason quorum queues give for the same thing
COUNTER_TTL_S = 24 * 3600

# One round trip, atomic, and the counter never exists without its expiry. KEYS[1] the counter,
# KEYS[2] the handling marker; ARGV[1] the counter's TTL. Counts the redelivery only if a
# handler had started fetching the message (the marker exists), and takes the marker: it speaks
# for one death only, and a copy that dies again unstarted, in another worker's buffer, must
# not count twice. Returns the count so far.
_COUNT_LUA = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if redis.call('DEL', KEYS[2]) == 1 then
  count = redis.call('INCR', KEYS[1])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
end
return count
"""
HANDLING_TTL_S = 600  # longer than any one handling of a message takes


def message_fingerprint(delivery: Delivery) -> str:
    """Names one message: its body, plus its replay count, so that an operator's replay of a
    dead letter starts with a clean slate instead of inheriting the old count."""
    replays = Progress.from_headers(delivery.headers).replays
    digest = hashlib.sha256(delivery.body)
    digest.update(f"|{REPLAY_HEADER}={replays}".encode())
    return digest.hexdigest()[:32]


class DeliveryLimit:
    """Call `check(delivery)` before handling: None to go on, or the Outcome that dead-letters it."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        namespace: str,
        worker_id: str,
        limit: int = POISON_DELIVERY_LIMIT,
        ttl_s: int = COUNTER_TTL_S,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._client = client
        self._keys = keys
        self._namespace = namespace
        self._worker_id = worker_id
        self.limit = limit
        self._ttl_s = ttl_s
        self._count = client.register_script(_COUNT_LUA)

    def check(self, delivery: Delivery) -> Outcome | None:
        if not delivery.redelivered:
            return None
        fingerprint = message_fingerprint(delivery)
        # Redis down: ServiceUnavailable, and the consumer pauses with the message unacked.
        with translate_redis_errors(self._client):
            deliveries = 1 + int(
                self._count(
                    keys=[self._keys.deliveries(fingerprint), self._keys.handling(fingerprint)],
                    args=[self._ttl_s],
                )
            )
        url = _url_of(delivery.body)
        if deliveries <= self.limit:
            log.info("redelivered %s from %s: delivery %d of %d", url, delivery.queue, deliveries, self.limit)
            return None
        log.warning(
            "dead-lettering %s: delivered %d times without being settled (limit %d)",
            url,
            deliveries,
            self.limit,
        )
        failure = Failure(
            REASON,
            f"delivered {deliveries} times without being settled; workers crashed or stopped while "
            "handling it",
            None,
            delivery.queue,
            self._worker_id,
        )
        body, about_body = bounded_body(delivery.body)
        progress = Progress.from_headers(delivery.headers)
        return Outcome.forward(
            Publication(
                dead_letter_exchange(self._namespace),
                delivery.queue,
                body,
                {**progress.to_headers(), **failure.to_headers(), **about_body},
            )
        )

    def mark_handling(self, delivery: Delivery) -> None:
        """Called before the part of a handling that could kill the worker (the fetch, the
        parse): if the worker dies from now on, this message is a suspect, and its redelivery
        counts. A handling that only reserves its URL a slot and holds it is not marked. The
        marker is held for the thread's next Redis command (the domain gate's, ordinarily),
        which carries it in the same round trip; `before_risk()` makes sure it has been
        written."""
        with translate_redis_errors(self._client):  # a plain client sends it at once
            write_later(
                self._client,
                "SET",
                self._keys.handling(message_fingerprint(delivery)),
                self._worker_id,
                "EX",
                HANDLING_TTL_S,
            )

    def before_risk(self) -> None:
        """Call just before the part that could kill the worker: a marker not yet carried by
        another command goes now, so that it exists in Redis before the worker can die."""
        with translate_redis_errors(self._client):
            flush(self._client)

    def unmark_handling(self, delivery: Delivery) -> None:
        """The last Redis write of a handling. Held, with the cache entry and the lease's
        release, for the thread's next command (the next message's first) or until the
        thread runs out of messages: the message is settled by then, so a marker that outlives
        it a little, or until it expires, counts for nothing."""
        with translate_redis_errors(self._client):  # a plain client sends it at once
            write_later(self._client, "DEL", self._keys.handling(message_fingerprint(delivery)))


def _url_of(body: bytes) -> str:
    try:
        return CrawlTask.decode(body).url
    except DecodeError:
        return "<undecodable>"
