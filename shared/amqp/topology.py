"""The whole RabbitMQ topology, as data. `shared.amqp.broker.declare_topology` applies it.

    producer ──new.<kind>──▶ <ns>.work (topic) ──*.<kind>──▶ <ns>.priority | <ns>.ttl | <ns>.bulk
                                   ▲                                   │ reject / expire
    worker ──d<ms>.<kind>──▶ <ns>.retry (topic) ──▶ <ns>.retry.<ms>ms ─┤ (TTL, then back to work)
    worker ──d<ms>.<kind>──▶ <ns>.defer (topic) ──▶ <ns>.defer.<ms>ms ─┘ (TTL, then back to work)
                                                                       ▼
    worker (3rd failure) ─────────────────────────────▶ <ns>.dlx (fanout) ──▶ <ns>.dead ──▶ dlq_consumer
                                                                    │ (recording failed)
                                                        <ns>.parked (fanout) ──▶ <ns>.parked
    worker (page stored, discovery run) ──links──▶ <ns>.discover (direct) ──▶ <ns>.discovery ──▶ frontier

    producer / worker ──new.render──▶ <ns>.work ──*.render──▶ <ns>.render ──▶ renderer

    ops.submit, POST /api/v1/runs ──(default exchange)──▶ <ns>.control.runs ──▶ producer --serve
                                                            │ (a request that does not decode)
                                                            ▶ <ns>.parked

A page that needs a browser (a routing rule says `render = "always"`, or RENDER=auto found a
script shell) travels as a task of kind `render`, through the same exchanges, retry and defer
queues, and dead-letter exchange as any other.

A retried URL (it failed) waits in a retry queue, a deferred URL (its domain could not take it
yet: rate limit, pause, concurrency, robots.txt being fetched; nothing failed) in a defer queue.
Both kinds are delay queues: after its delay the broker dead-letters the message into the work
exchange with its routing key unchanged, and `*.<kind>` sends it back to the queue it came
from. They are kept apart so that the broker's figures tell waiting for politeness from
failing. There is one delay queue per delay length because expired messages leave a classic
queue head first: a long delay at the head would hold back short ones behind it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.message_bounds import RENDER_KIND
from shared.messages import QUEUE_KINDS
from shared.redis.runstate import held_exchange
from shared.settings import Settings

MAX_MESSAGE_PRIORITY = 5
# The defer queues' delays. A deferral waits for the shortest of them at least as long as the
# wait the domain asked for (or the longest).
DEFERRAL_DELAYS_S = (1.0, 5.0, 30.0)
# Deliveries before a crash-looping URL is dead, counted by the worker (worker/handling/poison.py) and
# only for messages it was fetching when it died.
POISON_DELIVERY_LIMIT = 5
# The broker's own bound on quorum queues counts every redelivery, the innocent messages a dead
# worker held in its prefetch buffer too, so it is only a backstop, well above the worker's.
QUORUM_DELIVERY_LIMIT = 4 * POISON_DELIVERY_LIMIT
# Every classic queue is declared as version 2 and lazy: messages go straight to the queue's own
# store instead of also being kept in memory and journalled per message by the version-1 index.
# With the producer publishing persistent messages faster than workers take them, RabbitMQ 3.10
# spent about 100 µs of CPU per message on a default classic queue and about 40 µs on a lazy v2
# one. RabbitMQ 3.12 and later behave this way anyway and ignore the mode. Arguments cannot
# change on an existing queue: a namespace declared before needs its queues deleted first.
CLASSIC_QUEUE_ARGUMENTS: dict[str, Any] = {"x-queue-version": 2, "x-queue-mode": "lazy"}


def work_exchange(ns: str) -> str:
    return f"{ns}.work"


def retry_exchange(ns: str) -> str:
    return f"{ns}.retry"


def defer_exchange(ns: str) -> str:
    return f"{ns}.defer"


def dead_letter_exchange(ns: str) -> str:
    return f"{ns}.dlx"


def discovery_exchange(ns: str) -> str:
    return f"{ns}.discover"


def discovery_queue(ns: str) -> str:
    """One message a stored page of a discovery run: its links, for the frontier (producer/frontier.py)."""
    return f"{ns}.{DISCOVERY}"


LINKS_ROUTING_KEY = "links"


def work_queue(ns: str, kind: str) -> str:
    return f"{ns}.{kind}"


def render_queue(ns: str) -> str:
    """The queue the renderers consume: pages to load in a browser."""
    return work_queue(ns, RENDER_KIND)


def dead_letter_queue(ns: str) -> str:
    return f"{ns}.dead"


def parked_exchange(ns: str) -> str:
    return f"{ns}.parked"


def parked_queue(ns: str) -> str:
    """Dead letters the dead-letter consumer failed to record: kept for an operator, never dropped."""
    return f"{ns}.parked"


def control_queue(ns: str) -> str:
    """Crawl requests (shared/crawl_request.py) waiting for the producer service."""
    return f"{ns}.control.runs"


def delay_queue(ns: str, delay_ms: int) -> str:
    """The retry queue of one delay length: URLs that failed and will be tried again."""
    return f"{ns}.retry.{delay_ms}ms"


def defer_queue(ns: str, delay_ms: int) -> str:
    """The defer queue of one delay length: URLs waiting for their domain, not failed."""
    return f"{ns}.defer.{delay_ms}ms"


# The role of each queue name (queue_role), as status shows it.
WORK, RETRY, DEFER, DEAD, PARKED, HELD = "work", "retry", "defer", "dead", "parked", "held"
DISCOVERY = "discovery"  # the links of stored pages, for the frontier
CONTROL = "control"
_DELAY_NAME = re.compile(r"(retry|defer)\.([0-9]+)ms")


def queue_role(ns: str, name: str) -> str | None:
    """work | retry | defer | dead | parked | held | control | discovery for a queue of namespace
    `ns`; None for any other name, a queue of a longer namespace (`<ns>.x.bulk`) included.
    `held`: a paused run's hold queue, `<ns>.held.<run>` (shared/redis/runstate.py); `control`:
    the crawl requests waiting for the producer service; `discovery`: the links of stored pages."""
    if not name.startswith(f"{ns}."):
        return None
    rest = name[len(ns) + 1 :]
    if rest in QUEUE_KINDS or rest == RENDER_KIND:
        return WORK
    if rest in (DEAD, PARKED, DISCOVERY):
        return rest
    if rest == "control.runs":
        return CONTROL
    if rest.startswith(f"{HELD}.") and len(rest) > len(HELD) + 1:
        return HELD
    delay = _DELAY_NAME.fullmatch(rest)
    return delay.group(1) if delay else None


def new_task_routing_key(kind: str) -> str:
    return f"new.{kind}"


def delay_routing_key(delay_ms: int, kind: str) -> str:
    return f"d{delay_ms}.{kind}"


@dataclass(frozen=True)
class Exchange:
    name: str
    kind: str  # topic | fanout


@dataclass(frozen=True)
class Queue:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: tuple[tuple[str, str], ...] = ()  # (exchange, routing key)


@dataclass(frozen=True)
class Topology:
    namespace: str
    exchanges: tuple[Exchange, ...]
    queues: tuple[Queue, ...]
    delays_ms: tuple[int, ...]  # of the retry queues
    defer_delays_ms: tuple[int, ...] = tuple(int(s * 1000) for s in DEFERRAL_DELAYS_S)

    def work_queues(self) -> list[str]:
        return [work_queue(self.namespace, kind) for kind in QUEUE_KINDS]

    def delay_ms_for(self, seconds: float) -> int:
        """The shortest retry delay at least `seconds` long (or the longest there is)."""
        return _at_least(self.delays_ms, seconds)

    def defer_delay_ms_for(self, seconds: float) -> int:
        """The shortest defer delay at least `seconds` long (or the longest there is)."""
        return _at_least(self.defer_delays_ms, seconds)


def _at_least(delays_ms: tuple[int, ...], seconds: float) -> int:
    wanted = int(seconds * 1000)
    return next((d for d in delays_ms if d >= wanted), delays_ms[-1])


def build_topology(settings: Settings) -> Topology:
    ns = settings.crawl_namespace
    dlx = dead_letter_exchange(ns)
    delays_ms = tuple(sorted({int(s * 1000) for s in settings.retry_delays_s}))
    defer_delays_ms = tuple(sorted({int(s * 1000) for s in DEFERRAL_DELAYS_S}))

    def classic(args: dict[str, Any]) -> dict[str, Any]:
        return {**args, **CLASSIC_QUEUE_ARGUMENTS}

    def replicated(args: dict[str, Any]) -> dict[str, Any]:
        if settings.queue_type != "quorum":
            return classic(args)
        args = {**args, "x-queue-type": "quorum"}
        if "x-dead-letter-exchange" in args:
            # Quorum queues dead-letter at most once by default: a message expiring while the
            # target's leader is being elected (after a broker restart) would be dropped. With
            # at-least-once the broker keeps it until the target confirms; that strategy needs
            # reject-publish overflow.
            args.update({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
        return args

    def work(kind: str, arguments: dict[str, Any]) -> Queue:
        """A work queue, fed by the work exchange with the tasks of its kind (retries and
        deferrals coming back included)."""
        return Queue(work_queue(ns, kind), arguments, ((work_exchange(ns), f"*.{kind}"),))

    def delay_queues(exchange: str, name: Callable[[str, int], str], delays: tuple[int, ...]) -> list[Queue]:
        """One queue a delay length, fed by `exchange` with the tasks to wait that long, each
        dead-lettered back into the work exchange when its time is up."""
        return [
            Queue(
                name(ns, delay),
                replicated({"x-message-ttl": delay, "x-dead-letter-exchange": work_exchange(ns)}),
                ((exchange, delay_routing_key(delay, "*")),),
            )
            for delay in delays
        ]

    queues = [
        # Message priorities need a classic queue on RabbitMQ before 4.3.
        work("priority", classic({"x-max-priority": MAX_MESSAGE_PRIORITY, "x-dead-letter-exchange": dlx})),
        work(
            "ttl",
            replicated(
                {"x-message-ttl": int(settings.ttl_queue_expiry_s * 1000), "x-dead-letter-exchange": dlx}
            ),
        ),
        work("bulk", replicated({"x-dead-letter-exchange": dlx})),
        work(RENDER_KIND, replicated({"x-dead-letter-exchange": dlx})),
        Queue(
            dead_letter_queue(ns),
            replicated({"x-dead-letter-exchange": parked_exchange(ns)}),
            ((dlx, ""),),
        ),
        Queue(parked_queue(ns), replicated({}), ((parked_exchange(ns), ""),)),
        # No dead-letter exchange: a links message the frontier cannot read is no URL of the
        # run yet, and the dead-letter consumer records tasks.
        Queue(discovery_queue(ns), replicated({}), ((discovery_exchange(ns), LINKS_ROUTING_KEY),)),
        # Published to through the default exchange, by name. A request the producer service
        # refuses (it does not decode) is kept in the parked queue for an operator.
        Queue(control_queue(ns), replicated({"x-dead-letter-exchange": parked_exchange(ns)})),
    ]
    if settings.queue_type == "quorum":
        queues = [
            q
            if "x-max-priority" in q.arguments
            or q.name in (dead_letter_queue(ns), parked_queue(ns), discovery_queue(ns))
            else Queue(q.name, {**q.arguments, "x-delivery-limit": QUORUM_DELIVERY_LIMIT}, q.bindings)
            for q in queues
        ]
    queues += delay_queues(retry_exchange(ns), delay_queue, delays_ms)
    queues += delay_queues(defer_exchange(ns), defer_queue, defer_delays_ms)
    return Topology(
        namespace=ns,
        exchanges=(
            Exchange(work_exchange(ns), "topic"),
            Exchange(retry_exchange(ns), "topic"),
            Exchange(defer_exchange(ns), "topic"),
            Exchange(dlx, "fanout"),
            Exchange(parked_exchange(ns), "fanout"),
            Exchange(discovery_exchange(ns), "direct"),
            # Where workers move a paused run's messages (shared/redis/runstate.py). Declared by every
            # service, so a publish to it never finds it missing (a 404 would close the channel);
            # the run's queue is bound to it only while the run is paused.
            Exchange(held_exchange(ns), "direct"),
        ),
        queues=tuple(queues),
        delays_ms=delays_ms,
        defer_delays_ms=defer_delays_ms,
    )
