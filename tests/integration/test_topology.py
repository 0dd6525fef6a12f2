"""Declaring the topology against the real broker: idempotent, with the arguments we meant."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import quote

import pytest

from ops.management import HttpGet, api_url
from shared.amqp import broker
from shared.amqp.topology import (
    MAX_MESSAGE_PRIORITY,
    build_topology,
    dead_letter_exchange,
    dead_letter_queue,
    parked_exchange,
    work_exchange,
    work_queue,
)
from shared.errors import ConfigError
from shared.settings import Settings


def declare(settings: Settings) -> None:
    connection = broker.connect(settings, "test-topology")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        if connection.is_open:
            connection.close()


def queue_arguments(settings: Settings, get: HttpGet, name: str) -> dict[str, Any]:
    """The arguments the broker holds for a queue, from the management API."""
    arguments: dict[str, Any] = get(
        api_url(settings, f"queues/{quote('/', safe='')}/{quote(name, safe='')}")
    )["arguments"]
    return arguments


def test_declaring_twice_on_a_fresh_namespace_succeeds(settings: Settings) -> None:
    declare(settings)
    declare(settings)

    connection = broker.connect(settings, "test-topology")
    channel = connection.channel()
    for queue in build_topology(settings).queues:
        ready, consumers = broker.queue_depth(channel, queue.name)  # raises if missing
        assert (ready, consumers) == (0, 0)
    connection.close()


def test_every_queue_holds_the_arguments_we_declared(settings: Settings, management_api: HttpGet) -> None:
    declare(settings)
    ns = settings.crawl_namespace
    topology = build_topology(settings)

    for queue in topology.queues:
        assert queue_arguments(settings, management_api, queue.name) == queue.arguments

    ttl_args = queue_arguments(settings, management_api, work_queue(ns, "ttl"))
    assert ttl_args["x-message-ttl"] == int(settings.ttl_queue_expiry_s * 1000)
    assert ttl_args["x-dead-letter-exchange"] == dead_letter_exchange(ns)
    assert (
        queue_arguments(settings, management_api, work_queue(ns, "priority"))["x-max-priority"]
        == MAX_MESSAGE_PRIORITY
    )
    for delay_ms in topology.delays_ms:
        delay_args = queue_arguments(settings, management_api, f"{ns}.retry.{delay_ms}ms")
        assert delay_args["x-message-ttl"] == delay_ms
        assert delay_args["x-dead-letter-exchange"] == work_exchange(ns)
    for delay_ms in topology.defer_delays_ms:
        defer_args = queue_arguments(settings, management_api, f"{ns}.defer.{delay_ms}ms")
        assert defer_args["x-message-ttl"] == delay_ms
        assert defer_args["x-dead-letter-exchange"] == work_exchange(ns)
    # A dead letter the consumer cannot record is parked, never dropped.
    assert queue_arguments(settings, management_api, dead_letter_queue(ns))[
        "x-dead-letter-exchange"
    ] == parked_exchange(ns)


def test_a_changed_ttl_is_a_config_error_naming_the_way_out(settings: Settings) -> None:
    declare(settings)
    changed = dataclasses.replace(settings, ttl_queue_expiry_s=settings.ttl_queue_expiry_s + 1)

    with pytest.raises(ConfigError) as caught:
        declare(changed)

    message = str(caught.value)
    assert work_queue(settings.crawl_namespace, "ttl") in message
    assert "x-message-ttl" in message
    assert "CRAWL_NAMESPACE" in message
    assert "\n" not in message


def test_the_broker_still_works_after_a_refused_declaration(settings: Settings) -> None:
    declare(settings)
    with pytest.raises(ConfigError):
        declare(dataclasses.replace(settings, ttl_queue_expiry_s=1.0))

    declare(settings)  # the original settings still match what the broker holds
