"""AMQP_URL naming several nodes: a node that does not answer is passed over for the next, by
the blocking connections every consumer and operator command opens and by the producer's
publisher; with none answering, the error is one line naming RabbitMQ."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from producer.publisher import ConfirmingPublisher
from shared.amqp import broker
from shared.amqp.broker import Publication
from shared.amqp.topology import build_topology, new_task_routing_key, work_exchange, work_queue
from shared.errors import ServiceUnavailable
from shared.settings import Settings

DEAD = "amqp://guest:guest@127.0.0.1:1/%2f"  # nothing listens on port 1


def keep(_params: list[Any]) -> None:
    """Try the nodes in the order AMQP_URL gives: the dead one first."""


def test_a_blocking_connection_passes_over_a_dead_node(settings: Settings) -> None:
    with_dead_first = dataclasses.replace(settings, amqp_url=f"{DEAD},{settings.amqp_url}")
    params = broker.connection_parameters(with_dead_first, "test", keep)
    assert params[0].port == 1
    connection = broker.connect(with_dead_first, "several-nodes")
    try:
        broker.declare_topology(connection, build_topology(settings))
        assert connection.is_open
    finally:
        connection.close()


def test_the_publisher_passes_over_a_dead_node_and_gets_confirms(settings: Settings) -> None:
    connection = broker.connect(settings, "several-nodes-setup")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()
    with_dead_first = dataclasses.replace(settings, amqp_url=f"{DEAD},{DEAD},{settings.amqp_url}")
    ns = settings.crawl_namespace
    body = b'{"url": "http://127.0.0.1/x"}'
    publication = Publication(work_exchange(ns), new_task_routing_key("bulk"), body)
    with ConfirmingPublisher(with_dead_first, node_order=keep) as publisher:
        assert publisher.publish_batch([publication] * 20) == [True] * 20

    connection = broker.connect(settings, "several-nodes-check")
    try:
        ready, _consumers = broker.queue_depth(connection.channel(), work_queue(ns, "bulk"))
    finally:
        connection.close()
    assert ready == 20


def test_no_node_answering_is_one_line_naming_rabbitmq(settings: Settings) -> None:
    all_dead = dataclasses.replace(settings, amqp_url=f"{DEAD},amqp://guest:guest@127.0.0.1:2/%2f")
    with pytest.raises(ServiceUnavailable, match="RabbitMQ") as caught:
        broker.connect(all_dead, "several-nodes")
    assert "\n" not in str(caught.value)
    with (
        pytest.raises(ServiceUnavailable, match="RabbitMQ"),
        ConfirmingPublisher(all_dead, node_order=keep) as p,
    ):
        p.start()
