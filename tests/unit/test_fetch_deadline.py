"""One deadline for the whole fetch: connect, headers and body (shared/http/deadline.py).

The clock and socket logic is checked with small fakes; the end-to-end behaviour with a server on
127.0.0.1 that drips its headers, whose byte count tells how long the fetch held on.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from producer.fetch import FetchFailed, HttpFetcher
from shared.errors import TransientError
from shared.http.deadline import DeadlineReader, clipped_timeout, current_deadline, fetch_deadline
from shared.http.netguard import guarded_session
from shared.settings import Settings
from tests.fakes import FakeTime
from worker.fetch.fetcher import Fetcher

# --- the clock arithmetic ------------------------------------------------------------------


def test_a_timeout_is_kept_while_the_deadline_is_further() -> None:
    assert clipped_timeout(5.0, 110.0, FakeTime(100.0)) == 5.0


def test_a_timeout_is_cut_to_the_time_left() -> None:
    assert clipped_timeout(5.0, 102.5, FakeTime(100.0)) == 2.5


@pytest.mark.parametrize("unbounded", [None, object()])  # no timeout, urllib3's "default" marker
def test_the_deadline_bounds_a_wait_that_had_no_timeout(unbounded: object) -> None:
    assert clipped_timeout(unbounded, 103.0, FakeTime(100.0)) == 3.0


def test_no_time_left_is_a_timeout() -> None:
    with pytest.raises(TimeoutError):
        clipped_timeout(5.0, 100.0, FakeTime(100.0))


def test_without_a_deadline_the_timeout_is_untouched() -> None:
    assert clipped_timeout(5.0, None, FakeTime(100.0)) == 5.0


def test_the_deadline_belongs_to_the_block_that_set_it() -> None:
    assert current_deadline() is None
    with fetch_deadline(123.0):
        assert current_deadline() == 123.0
        seen: list[float | None] = []
        other = threading.Thread(target=lambda: seen.append(current_deadline()))
        other.start()
        other.join()
        assert seen == [None]  # another thread's fetches are not bound by this one
    assert current_deadline() is None


# --- each socket read ----------------------------------------------------------------------


class FakeSocket:
    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.set: list[float] = []

    def gettimeout(self) -> float | None:
        return self.timeout

    def settimeout(self, value: float) -> None:
        self.timeout = value
        self.set.append(value)


class FakeRaw:
    """A SocketIO that hands out one byte per read, as a dripping server does."""

    def __init__(self) -> None:
        self.reads = 0
        self.closed_by_reader = False

    def readinto(self, buffer: Any) -> int:
        self.reads += 1
        buffer[0:1] = b"x"
        return 1

    def close(self) -> None:
        self.closed_by_reader = True


def reader(
    timeout: float | None, deadline: float, clock: FakeTime
) -> tuple[DeadlineReader, FakeSocket, FakeRaw]:
    sock, raw = FakeSocket(timeout), FakeRaw()
    return DeadlineReader(raw, sock, deadline, clock), sock, raw  # type: ignore[arg-type]


def test_reads_far_from_the_deadline_leave_the_socket_alone() -> None:
    clock = FakeTime(100.0)
    made, sock, raw = reader(15.0, 130.0, clock)
    for _ in range(10):
        assert made.readinto(bytearray(8)) == 1
        clock.now += 1.0
    assert raw.reads == 10
    assert sock.set == []  # no system call while the read timeout is the nearer limit


def test_reads_near_the_deadline_wait_only_for_the_time_left() -> None:
    clock = FakeTime(100.0)
    made, sock, _ = reader(15.0, 110.0, clock)
    made.readinto(bytearray(8))  # 10 s left: the timeout of 15 s is cut
    clock.now = 106.0
    made.readinto(bytearray(8))  # 4 s left
    clock.now = 106.5
    made.readinto(bytearray(8))  # 3.5 s left
    assert sock.set == [10.0, 4.0, 3.5]


def test_a_read_past_the_deadline_is_a_timeout_and_reads_nothing() -> None:
    clock = FakeTime(100.0)
    made, _, raw = reader(None, 101.0, clock)
    made.readinto(bytearray(8))
    clock.now = 101.0
    with pytest.raises(TimeoutError):
        made.readinto(bytearray(8))
    assert raw.reads == 1


def test_a_dripping_stream_read_through_a_buffer_ends_at_the_deadline() -> None:
    # What http.client does with the headers: readline() over a buffer over the reader.
    clock = FakeTime(100.0)
    made, _, raw = reader(15.0, 102.0, clock)

    def tick(buffer: Any) -> int:
        clock.now += 0.5  # each byte arrives half a second after the last
        buffer[0:1] = b"x"
        return 1

    raw.readinto = tick  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        io.BufferedReader(made).readline()
    assert clock.now == 102.0  # four bytes, two seconds: then no further read was started


def test_closing_the_reader_closes_the_socket_file() -> None:
    made, _, raw = reader(1.0, 200.0, FakeTime(100.0))
    made.close()
    assert raw.closed_by_reader and made.closed


# --- connecting ----------------------------------------------------------------------------


SETTINGS = dataclasses.replace(
    Settings(),
    fetch_allowlist="127.0.0.0/8",
    fetch_connect_timeout_s=5.0,
    fetch_read_timeout_s=5.0,
    fetch_deadline_s=1.0,
)


def test_every_connect_attempt_waits_only_until_the_deadline() -> None:
    timeouts: list[float] = []

    def refuse(address: tuple[str, int], timeout: Any, *rest: Any) -> socket.socket:
        timeouts.append(timeout)
        raise ConnectionRefusedError("refused")  # each address in turn, as a dead host would

    session = guarded_session(
        SETTINGS, resolver=lambda host, port: ["127.0.0.2", "127.0.0.3"], open_socket=refuse
    )
    with Fetcher(SETTINGS, session_factory=lambda: session) as fetcher, pytest.raises(TransientError):
        fetcher.fetch("http://two-addresses.test/")
    assert len(timeouts) == 2
    assert all(0 < t <= SETTINGS.fetch_deadline_s for t in timeouts)  # not the connect timeout of 5 s


# --- against a server that drips ----------------------------------------------------------


PAGE = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 15\r\n\r\n<html>ok</html>"


class DripServer:
    """Answers every request with a status line, then headers one byte per `interval_s`, or
    with a redirect to the next hop after `interval_s`. Counts what it sent."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.header_bytes_sent = 0
        self.hops_answered = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                while request := conn.recv(65536):
                    path = request.split(b" ", 2)[1].decode()
                    if path == "/ok":
                        conn.sendall(PAGE)
                        continue
                    if path.startswith("/hop/"):
                        self._stop.wait(self.interval_s)
                        self.hops_answered += 1
                        n = int(path.rsplit("/", 1)[1]) + 1
                        conn.sendall(
                            f"HTTP/1.1 302 Found\r\nLocation: /hop/{n}\r\nContent-Length: 0\r\n\r\n".encode()
                        )
                        continue
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
                    for byte in b"X-Drip: " + b"a" * 10_000:
                        if self._stop.wait(self.interval_s):
                            return
                        conn.sendall(bytes([byte]))
                        self.header_bytes_sent += 1
            except OSError:
                return  # the fetcher gave up and closed: what it should do

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer(interval_s=0.05)
    yield server
    server.close()


@pytest.fixture
def fetcher() -> Iterator[Fetcher]:
    with Fetcher(SETTINGS, session_factory=lambda: guarded_session(SETTINGS)) as made:
        yield made


def test_headers_dripping_within_the_read_timeout_end_at_the_deadline(
    drip: DripServer, fetcher: Fetcher
) -> None:
    # Each byte comes 0.05 s after the last, far within the read timeout of 5 s: only the
    # deadline of 1 s can end it. Without it the fetch would read all 10,008 header bytes (500 s).
    with pytest.raises(TransientError) as caught:
        fetcher.fetch(drip.url("/drip"))
    assert caught.value.reason == "timeout"
    assert 0 < drip.header_bytes_sent <= SETTINGS.fetch_deadline_s / drip.interval_s + 2


def test_redirect_hops_share_one_deadline(fetcher: Fetcher) -> None:
    # Every hop answers after 0.3 s, well within the read timeout; five hops would take 1.5 s.
    server = DripServer(interval_s=0.3)
    try:
        with pytest.raises(TransientError) as caught:
            fetcher.fetch(server.url("/hop/0"))
        assert caught.value.reason == "timeout"
        assert server.hops_answered <= 4  # the chain was cut at the deadline, not at its end
    finally:
        server.close()


def test_the_fetcher_works_again_after_a_deadline(drip: DripServer, fetcher: Fetcher) -> None:
    with pytest.raises(TransientError):
        fetcher.fetch(drip.url("/drip"))
    for _ in range(3):  # the pooled connection, and its socket's timeout, serve the next fetches
        assert fetcher.fetch(drip.url("/ok")).body == b"<html>ok</html>"


def test_the_producer_cuts_dripping_headers_at_its_deadline(drip: DripServer) -> None:
    settings = dataclasses.replace(SETTINGS, fetch_deadline_s=0.25)  # sitemaps get four times that
    with HttpFetcher(settings) as fetch, pytest.raises(FetchFailed, match="took longer than 1 s"):
        fetch(drip.url("/drip"))
    assert 0 < drip.header_bytes_sent <= 1.0 / drip.interval_s + 2
