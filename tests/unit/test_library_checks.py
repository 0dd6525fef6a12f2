"""The checks in front of libraries' private parts (shared/library_checks.py, pika_compat.py,
urllib3_compat.py), with injected versions and fakes."""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path

import pika
import pytest
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.connection import HTTPConnection, HTTPSConnection

from shared import library_checks
from shared.amqp import pika_compat
from shared.http import urllib3_compat


@pytest.mark.parametrize(
    ("version", "inside"),
    [("1.3.0", True), ("1.4.4", True), ("1.4.99rc1", True), ("1.2.9", False), ("1.5.0", False), ("", False)],
)
def test_a_version_is_inside_the_checked_range_or_says_why_not(version: str, inside: bool) -> None:
    why = library_checks.outside(version, (1, 3), (1, 5))
    assert (why is None) is inside
    if not inside:
        assert why == f"version {version or 'unknown'} is outside the checked range >=1.3,<1.5"


def test_a_fallback_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shared.library_checks"):
        for _ in range(3):
            library_checks.warn_fallback("a test's private part", "gone", "the public one")
    assert [r.getMessage() for r in caplog.records] == [
        "a test's private part is off (gone): using the public one"
    ]


class FakeChannel:
    """A BlockingChannel's shape: its own basic_ack, and perhaps the channel underneath."""

    def __init__(self, underneath: FakeChannel | None = None, channel_number: int = 1) -> None:
        self.acked: list[int] = []
        self.channel_number = channel_number
        if underneath is not None:
            self._impl = underneath

    def basic_ack(self, delivery_tag: int) -> None:
        self.acked.append(delivery_tag)


def test_acks_go_to_the_channel_underneath_where_pika_has_one() -> None:
    underneath = FakeChannel()
    channel = FakeChannel(underneath)
    pika_compat.batched_ack(channel)(7)
    pika_compat.batched_ack(channel, private_api=False)(8)
    assert (underneath.acked, channel.acked) == ([7], [8])


@pytest.mark.parametrize("underneath", [None, FakeChannel(channel_number=2)], ids=["none", "another"])
def test_acks_fall_back_to_the_public_ack_and_say_so(
    underneath: FakeChannel | None, caplog: pytest.LogCaptureFixture
) -> None:
    library_checks._warned.discard("pika's batched acks")
    channel = FakeChannel(underneath)
    with caplog.at_level(logging.WARNING):
        pika_compat.batched_ack(channel)(9)
    assert channel.acked == [9]
    assert "pika's batched acks is off" in caplog.text


@pytest.mark.parametrize("version", ["1.2.0", "1.5.0", "2.0.0"])
def test_pika_versions_outside_the_checked_range_take_the_public_path(version: str) -> None:
    assert pika_compat.private_parts_checked(version) is not None
    assert pika_compat.private_parts_checked("1.4.4") is None


def test_the_urllib3_probe_passes_the_private_path_on_the_installed_urllib3() -> None:
    assert urllib3_compat.private_path_checked() is None
    assert urllib3_compat.reaches_connector(functools.partial(urllib3_compat._classes, False))


class _OpensItsOwnSocket(HTTPConnection):
    """What an urllib3 whose connect() no longer calls _new_conn looks like to the probe."""

    connector: urllib3_compat.Connector

    def _new_conn(self) -> socket.socket:
        return self.connector.connect(self)

    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port or 80), 0.5)


def _unhooked(connector: urllib3_compat.Connector) -> dict[str, type]:
    plain = type("Unhooked", (_OpensItsOwnSocket,), {"connector": connector})
    tls = type("UnhookedTLS", (HTTPSConnection,), {})
    return {
        "http": type("Pool", (HTTPConnectionPool,), {"ConnectionCls": plain}),
        "https": type("TLSPool", (HTTPSConnectionPool,), {"ConnectionCls": tls}),
    }


def test_the_urllib3_probe_refuses_a_connect_that_goes_around_the_hook() -> None:
    # The probe's closed loopback port refuses the connection the guard never saw.
    assert urllib3_compat.check_private_path("2.8.0", _unhooked) == (
        "HTTPConnection.connect() no longer opens its socket with _new_conn"
    )


def test_urllib3_versions_outside_the_checked_range_take_the_public_path() -> None:
    hooked = functools.partial(urllib3_compat._classes, True)
    assert urllib3_compat.check_private_path("2.8.0", hooked) is None
    assert "outside the checked range" in str(urllib3_compat.check_private_path("3.0.0", hooked))
    assert "outside the checked range" in str(urllib3_compat.check_private_path("1.26.20", hooked))


def test_ci_tests_the_newest_allowed_versions_after_the_tests_and_before_the_faults() -> None:
    repo = Path(__file__).resolve().parents[2]
    lines = (repo / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert lines.index("make test") < lines.index("make test-latest") < lines.index("make faults")
    recipe = (repo / "Makefile").read_text(encoding="utf-8").split("\ntest-latest:\n", 1)[1].split("\n\n")[0]
    assert "pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'" in recipe
    assert "-m tests.library_versions" in recipe
    assert "pytest -m 'unit or integration'" in recipe


def unopened_connection(private_api: bool = True) -> pika_compat.BatchWritingConnection:
    """A publisher's connection as made, before its I/O loop runs: nothing written yet."""
    params = pika.ConnectionParameters(host="127.0.0.1", port=9, connection_attempts=1)
    return pika_compat.BatchWritingConnection(params, private_api=private_api)


def test_a_connection_whose_writes_never_reached_the_hook_publishes_with_pika_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    library_checks._warned.discard("the publisher's joined writes")
    connection = unopened_connection()
    try:
        assert connection.sends_own_frames  # until the check on first use
        with caplog.at_level(logging.WARNING):
            connection.confirm_hooked()  # as if open, yet no frame went through the override
        assert not connection.sends_own_frames
        assert "did not pass through _adapter_emit_data" in caplog.text
        with pytest.raises(RuntimeError, match="frames of our own"):
            connection.emit(b"frames")
        with connection.writes_joined():  # a plain block: nothing held
            pass
    finally:
        connection.ioloop.close()


def test_a_connection_asked_for_the_public_path_takes_it_quietly(caplog: pytest.LogCaptureFixture) -> None:
    connection = unopened_connection(private_api=False)
    try:
        with caplog.at_level(logging.WARNING):
            connection.confirm_hooked()
        assert not connection.sends_own_frames and caplog.text == ""
    finally:
        connection.ioloop.close()
