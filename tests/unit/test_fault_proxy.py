"""The soak's fault proxy (tests/soak/proxy.py) between two real loopback sockets: bytes pass
both ways unchanged, a delay holds each byte back by it, a stall holds everything until it
ends, a reset aborts the connections open (the peer sees ECONNRESET) and leaves new ones be."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.soak.proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = FaultProxy(0, server.server_address[1]).start()
    yield started
    started.stop()
    server.shutdown()
    server.server_close()


def connect(proxy: FaultProxy) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def round_trip(client: socket.socket, payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    client.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = client.recv(65536)
        assert chunk, "the proxy closed the connection"
        got += chunk
    return got, time.monotonic() - started


def test_bytes_pass_both_ways_unchanged(proxy: FaultProxy) -> None:
    with connect(proxy) as client:
        payload = bytes(range(256)) * 1000
        assert round_trip(client, payload)[0] == payload
        assert round_trip(client, b"again")[0] == b"again"
    assert proxy.accepted == 1


def test_a_delay_holds_each_way_back_by_it_and_healing_takes_it_away(proxy: FaultProxy) -> None:
    with connect(proxy) as client:
        _, fast = round_trip(client, b"ping")
        proxy.delay(0.3)
        got, slow = round_trip(client, b"ping")
        assert got == b"ping"
        assert slow >= 0.6, "0.3 s each way"  # out and back
        assert slow < 0.6 + 1.0
        proxy.heal()
        _, healed = round_trip(client, b"ping")
    assert fast < 0.3 and healed < 0.3


def test_a_delay_is_a_latency_not_a_cap_on_throughput(proxy: FaultProxy) -> None:
    proxy.delay(0.2)
    with connect(proxy) as client:
        started = time.monotonic()
        for _ in range(20):  # twenty chunks sent back to back arrive 0.2 s later, not 20 x 0.4 s
            client.sendall(b"x" * 1000)
            time.sleep(0.01)
        got = b""
        while len(got) < 20_000:
            got += client.recv(65536)
        assert time.monotonic() - started < 2.0


def test_a_stall_forwards_nothing_until_it_ends(proxy: FaultProxy) -> None:
    with connect(proxy) as client:
        proxy.stall(True)
        client.sendall(b"held")
        client.settimeout(0.5)
        with pytest.raises(TimeoutError):
            client.recv(10)
        proxy.stall(False)
        client.settimeout(5)
        assert client.recv(10) == b"held"


def test_a_reset_aborts_open_connections_and_new_ones_work(proxy: FaultProxy) -> None:
    first, second = connect(proxy), connect(proxy)
    try:
        round_trip(first, b"a"), round_trip(second, b"b")
        assert proxy.open_connections() == 2
        assert proxy.reset() == 2
        for client in (first, second):
            with pytest.raises(ConnectionResetError):
                client.sendall(b"after")
                client.recv(10)
        with connect(proxy) as third:
            assert round_trip(third, b"fresh")[0] == b"fresh"
    finally:
        first.close()
        second.close()


def test_refusing_resets_new_connections_at_once(proxy: FaultProxy) -> None:
    proxy.refuse(True)
    # The reset may reach the client while it still sets up its socket, or at its first read.
    with pytest.raises((ConnectionResetError, BrokenPipeError)), connect(proxy) as client:
        client.sendall(b"x")
        assert client.recv(10) == b""
        client.sendall(b"y")
    proxy.refuse(False)
    with connect(proxy) as client:
        assert round_trip(client, b"back")[0] == b"back"
