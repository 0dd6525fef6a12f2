"""broker.connect against loopback ports where no broker answers: each failure is one line
naming the address (ServiceUnavailable), never a pika exception."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from shared.amqp import broker
from shared.errors import ServiceUnavailable
from shared.settings import Settings
from tests.ports import closed_port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel completes them) but never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def settings_for(url: str) -> Settings:
    return Settings.from_env({"AMQP_URL": url})


def test_a_closed_port_is_one_line_naming_the_address() -> None:
    port = closed_port()
    with pytest.raises(ServiceUnavailable) as caught:
        broker.connect(settings_for(f"amqp://guest:s3cret@127.0.0.1:{port}/%2F"), "test")
    assert str(caught.value).splitlines() == [
        f"cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:{port}/%2F: Connection refused "
        "(start it with: rabbitmq-server -detached)"
    ]


def test_a_port_that_never_answers_the_handshake_is_one_line_naming_the_address(silent_port: int) -> None:
    url = f"amqp://guest:s3cret@127.0.0.1:{silent_port}/%2F?stack_timeout=0.5"
    with pytest.raises(ServiceUnavailable) as caught:
        broker.connect(settings_for(url), "test")
    assert str(caught.value).splitlines() == [
        f"cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:{silent_port}/%2F?stack_timeout=0.5: "
        "no AMQP handshake before the stack timeout (check the host and port in AMQP_URL)"
    ]
