"""broker.connect against loopback ports where no broker answers: each failure is one line
naming the address (ServiceUnavailable), never a pika exception."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pika
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


def _reset_between_connect_and_check(_parameters: list[pika.URLParameters]) -> pika.BlockingConnection:
    """What pika 1.4's connector raises when the TCP connection it just made is reset before its
    getpeername() check (seen in the soak, behind a proxy whose broker was down)."""
    raise ValueError(
        "Expected connected socket, but getpeername() failed: error=OSError(107, 'Transport endpoint "
        "is not connected'); <socket.socket fd=8, family=2, type=1, proto=6, laddr=('127.0.0.1', 39816)>; "
    )


def test_a_connection_reset_before_pikas_socket_check_is_a_lost_connection_not_a_crash() -> None:
    settings = settings_for("amqp://guest:s3cret@127.0.0.1:5999/%2F")
    with pytest.raises(ServiceUnavailable) as caught:
        broker.connect(settings, "test", open_connection=_reset_between_connect_and_check)
    assert str(caught.value).splitlines() == [
        "cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:5999/%2F: Expected connected socket, but "
        "getpeername() failed: error=OSError(107, 'Transport endpoint is not connected'); <socket.socket "
        "fd=8, family=2, type=1, proto=6, laddr=('127.0.0.1', 39816)>; "
        "(start it with: rabbitmq-server -detached)"
    ]


def test_any_other_value_error_from_the_connection_is_not_taken_for_a_lost_one() -> None:
    def misconfigured(_parameters: list[pika.URLParameters]) -> pika.BlockingConnection:
        raise ValueError("Expected ssl_context=None | ssl.SSLContext")

    with pytest.raises(ValueError, match="ssl_context"):
        broker.connect(
            settings_for("amqp://guest:s3cret@127.0.0.1:5999/%2F"), "test", open_connection=misconfigured
        )
