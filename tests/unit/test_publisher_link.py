"""The producer's publishing link (producer/publisher.py) when pika's connector fails inside the
I/O loop, with a fake SelectConnection built through the link's `open_connection` seam."""

from __future__ import annotations

from typing import Any

import pytest

from producer.publisher import _Link
from shared.errors import ServiceUnavailable
from shared.settings import Settings

LOST = (
    "Expected connected socket, but getpeername() failed: error=OSError(107, 'Transport endpoint is "
    "not connected'); <socket.socket fd=7, family=2, type=1, proto=6, laddr=('127.0.0.1', 49904)>; "
)


class RaisingLoop:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closed = False

    def start(self) -> None:
        raise self.error

    def close(self) -> None:
        self.closed = True


def opening(error: Exception) -> tuple[list[RaisingLoop], Any]:
    loops: list[RaisingLoop] = []

    def open_connection(_params: Any, **_callbacks: Any) -> Any:
        loops.append(RaisingLoop(error))
        return type("FakeConnection", (), {"ioloop": loops[-1]})()

    return loops, open_connection


def link(open_connection: Any) -> _Link:
    settings = Settings.from_env({"AMQP_URL": "amqp://guest:s3cret@127.0.0.1:5999/%2F"})
    return _Link(settings, "test", lambda nodes: None, open_connection=open_connection)


def test_a_reset_before_pikas_socket_check_in_the_loop_is_one_line_not_a_dead_thread() -> None:
    # Seen in the soak: a frontier's I/O thread died of this with a traceback, and the producer
    # waited out its connect timeout before saying it could not reach RabbitMQ.
    loops, open_connection = opening(ValueError(LOST))
    with pytest.raises(ServiceUnavailable) as caught:
        link(open_connection).start()
    assert str(caught.value).splitlines() == [
        f"cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:5999/%2F: {LOST}"
        "(start it with: rabbitmq-server -detached)"
    ]
    assert len(loops) == 1 and loops[0].closed


def test_any_other_value_error_in_the_loop_is_not_taken_for_a_lost_connection() -> None:
    _loops, open_connection = opening(ValueError("a bug"))
    broken = link(open_connection)
    with pytest.raises(ValueError, match="a bug"):
        broken._run()
