"""Connections, topology, confirmed publishing over pika (the producer's pipelined publisher is the
other module that imports it).

pika errors are translated here: a broker that cannot be reached becomes ServiceUnavailable,
a queue declared earlier with other arguments becomes ConfigError. pika is not thread-safe: a
connection and its channels are used only from the thread that opened them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.adapters.utils.connection_workflow import AMQPConnectorException, AMQPConnectorStackTimeout

from shared.amqp.topology import Topology
from shared.errors import ConfigError, PipelineError, ServiceUnavailable, one_line
from shared.settings import Settings, amqp_urls, redact

log = logging.getLogger("shared.broker")  # the name operators know: kept as the module moved

START_HINT = "start it with: rabbitmq-server -detached"

# Everything pika raises when the connection or channel is gone.
LOST_BEFORE_HANDSHAKE = "Expected connected socket, but getpeername() failed"
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pika.exceptions.AMQPConnectionError,
    pika.exceptions.ConnectionWrongStateError,
    pika.exceptions.ChannelWrongStateError,
    pika.exceptions.ChannelClosed,
    ConnectionError,
    OSError,
)


@dataclass(frozen=True)
class Joining:
    """How publications to one exchange and routing key may go out as one message: `join` makes
    one body of theirs, for as many as fit in `max_bytes` together and at most `max_count`. A
    consumer loop joins those it settles at the same moment (shared/consumer/settling.py): one
    publish and one confirm instead of one each."""

    join: Callable[[Sequence[bytes]], bytes]
    max_bytes: int
    max_count: int


@dataclass(slots=True)  # not frozen: the producer makes one for every URL, and frozen ones build slowly
class Publication:
    """One message to publish, persistent, waiting for the broker's confirm."""

    exchange: str
    routing_key: str
    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    # Published instead when the broker cannot route this one (no queue bound), if set.
    if_unroutable: Publication | None = None
    # Set when the body may go out joined with the bodies of others of the same Joining, exchange,
    # routing key and priority, none with headers.
    joins: Joining | None = None

    def properties(self) -> pika.BasicProperties:
        return pika.BasicProperties(
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type="application/json",
            # No table at all rather than an empty one: the broker decodes every table it gets.
            headers=dict(self.headers) or None,
            priority=self.priority,
        )


# Puts the nodes' parameters in the order they are tried, in place (random.shuffle by default).
NodeOrder = Callable[[list[Any]], None]


def connection_parameters(
    settings: Settings, name: str, order: NodeOrder = random.shuffle
) -> list[pika.URLParameters]:
    """One pika parameter set per node AMQP_URL names. pika tries them in the order given and
    keeps the first that answers; `order` shuffles them so that a fleet of processes spreads its
    connections over a cluster's nodes instead of all landing on the first."""
    every = []
    for url in amqp_urls(settings.amqp_url):
        params = pika.URLParameters(url)
        params.heartbeat = settings.heartbeat_s
        params.blocked_connection_timeout = 60
        params.client_properties = {"connection_name": name}
        every.append(params)
    order(every)
    return every


def connect(
    settings: Settings,
    name: str,
    open_connection: Callable[[list[pika.URLParameters]], pika.BlockingConnection] = pika.BlockingConnection,
) -> pika.BlockingConnection:
    try:
        return open_connection(connection_parameters(settings, name))
    except pika.exceptions.ProbableAuthenticationError:
        raise ServiceUnavailable(
            "RabbitMQ", redact(settings.amqp_url), "login refused", "check the user and password in AMQP_URL"
        ) from None
    except AMQPConnectorStackTimeout:
        # Something listens there, but it does not answer as RabbitMQ would (not even a refusal).
        raise ServiceUnavailable(
            "RabbitMQ",
            redact(settings.amqp_url),
            "no AMQP handshake before the stack timeout",
            "check the host and port in AMQP_URL",
        ) from None
    except (*CONNECTION_ERRORS, AMQPConnectorException) as exc:
        # pika lets its connector's own errors (timeouts, aborts) through untranslated.
        raise unavailable(settings, exc) from None
    except ValueError as exc:
        # pika 1.3-1.4 checks the TCP connection with getpeername() after its connect succeeded:
        # one reset in between (a proxy or balancer in front of a broker that is down) raises a
        # ValueError from its connector. It is a lost connection; the soak found a worker that
        # died of it while reconnecting (docs/RELIABILITY.md).
        if LOST_BEFORE_HANDSHAKE not in str(exc):
            raise
        raise unavailable(settings, exc) from None


def unavailable(settings: Settings, exc: BaseException) -> ServiceUnavailable:
    return ServiceUnavailable("RabbitMQ", redact(settings.amqp_url), _innermost(exc), START_HINT)


def _innermost(exc: BaseException) -> str:
    """pika wraps the socket error a few layers deep; the operator wants the socket error."""
    seen: BaseException = exc
    for _ in range(5):
        inner = next((a for a in seen.args if isinstance(a, BaseException)), None)
        inner = inner or next((a for a in seen.args if hasattr(a, "exception")), None)
        if inner is None:
            break
        seen = inner.exception if hasattr(inner, "exception") else inner
        if isinstance(seen, OSError):
            return seen.strerror or str(seen)
    return one_line(seen)


def declare_topology(connection: pika.BlockingConnection, topology: Topology) -> None:
    """Declare every exchange, queue and binding; idempotent. Uses a throwaway channel because a
    failed declaration closes the channel it was made on."""
    channel = connection.channel()
    try:
        for exchange in topology.exchanges:
            channel.exchange_declare(exchange.name, exchange.kind, durable=True)
        for queue in topology.queues:
            channel.queue_declare(queue.name, durable=True, arguments=queue.arguments)
            for exchange_name, routing_key in queue.bindings:
                channel.queue_bind(queue.name, exchange_name, routing_key)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 406:  # PRECONDITION_FAILED: exists with other arguments
            raise ConfigError(
                f"RabbitMQ: {exc.reply_text}. A queue or exchange already exists with other "
                "settings: delete it (management UI or rabbitmqctl delete_queue) or set another "
                "CRAWL_NAMESPACE"
            ) from None
        raise
    if channel.is_open:
        channel.close()


def confirm_channel(connection: pika.BlockingConnection) -> BlockingChannel:
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def publish(channel: BlockingChannel, publication: Publication) -> None:
    """Publish and wait for the confirm. Raises PublishFailed if the broker refuses or cannot route."""
    try:
        channel.basic_publish(
            publication.exchange,
            publication.routing_key,
            publication.body,
            publication.properties(),
            mandatory=True,
        )
    except pika.exceptions.UnroutableError as exc:
        if publication.if_unroutable is None:
            raise PublishFailed(f"{publication.exchange}/{publication.routing_key}: {exc}") from None
        log.info(
            "%s/%s: no queue bound; publishing to %s/%s instead",
            publication.exchange,
            publication.routing_key,
            publication.if_unroutable.exchange,
            publication.if_unroutable.routing_key,
        )
        publish(channel, publication.if_unroutable)
    except pika.exceptions.NackError as exc:
        raise PublishFailed(f"{publication.exchange}/{publication.routing_key}: {exc}") from None


# Raised before anything is sent, for a message pika cannot encode.
UNPUBLISHABLE: tuple[type[BaseException], ...] = (pika.exceptions.UnsupportedAMQPFieldException, TypeError)


class PublishFailed(PipelineError):
    """The broker nacked or could not route a message. The caller keeps its original."""


def queue_depth(channel: BlockingChannel, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of a queue, without the management plugin."""
    ok = channel.queue_declare(queue, passive=True)
    return ok.method.message_count, ok.method.consumer_count
