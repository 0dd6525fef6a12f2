"""One deadline for a whole HTTP fetch: connect, status line, headers and body.

urllib3's timeouts apply to each wait on the socket, not to the fetch: a server that sends its
headers a byte every two seconds, each byte within the read timeout, holds a fetch for as long as
it keeps dripping. Checking the clock between body reads does not help either, since the headers
are read inside urllib3 before the caller sees a response.

So a deadline is set for the requests a thread makes (`fetch_deadline(deadline)`, a
`time.monotonic()` value), and the connections made by shared/http/netguard.py honour it in their own
waits: each connect attempt, and each socket read of the response (status line, headers and body
alike), waits at most until the deadline. A read that would start past it raises TimeoutError,
which urllib3 reports as a read timeout like any other. The common path costs one clock read per
socket read; the socket's timeout is only lowered once the deadline is nearer than it.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

Clock = Callable[[], float]

_DEADLINE: ContextVar[float | None] = ContextVar("fetch_deadline", default=None)


@contextlib.contextmanager
def fetch_deadline(deadline: float) -> Iterator[None]:
    """Bound every request this thread makes inside the block by `deadline` (time.monotonic())."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float | None:
    return _DEADLINE.get()


def clipped_timeout(timeout: Any, deadline: float | None, clock: Clock = time.monotonic) -> Any:
    """The timeout for one wait: `timeout`, or the time left before `deadline` when that is
    shorter. Raises TimeoutError when no time is left. `timeout` may be None (no limit) or
    urllib3's "default" marker, both of which the deadline replaces."""
    if deadline is None:
        return timeout
    remaining = deadline - clock()
    if remaining <= 0:
        raise TimeoutError("fetch deadline passed")
    if isinstance(timeout, int | float) and timeout < remaining:
        return timeout
    return remaining


class DeadlineReader(io.RawIOBase):
    """Raw reads from a socket (through its SocketIO), none waiting past the deadline."""

    def __init__(self, raw: io.RawIOBase, sock: Any, deadline: float, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self._raw = raw
        self._sock = sock
        self._deadline = deadline
        self._clock = clock
        self._timeout: float | None = sock.gettimeout()  # the read timeout urllib3 set

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        remaining = self._deadline - self._clock()
        if self._timeout is None or remaining < self._timeout:
            if remaining <= 0:
                raise TimeoutError("fetch deadline passed")
            # Lowered only when the deadline is the nearer limit: settimeout is a system call.
            self._sock.settimeout(remaining)
            self._timeout = remaining
        return self._raw.readinto(buffer)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineSocket:
    """What http.client.HTTPResponse asks of its socket (one makefile call), with the file's reads
    bound by the deadline."""

    def __init__(self, sock: Any, deadline: float) -> None:
        self._sock = sock  # a socket, an SSLSocket, or urllib3's SSLTransport through a proxy
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        # Unbuffered, the socket's own file is its SocketIO, which keeps the socket open as long
        # as the response reads from it; the buffer goes on top of the deadline, as makefile's would.
        assert mode == "rb"  # all http.client asks for
        raw = self._sock.makefile("rb", buffering=0)
        return io.BufferedReader(DeadlineReader(raw, self._sock, self._deadline))


class DeadlineHTTPResponse(http.client.HTTPResponse):
    """http.client's response, reading through the deadline of the thread that made it."""

    def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
        deadline = _DEADLINE.get()
        # HTTPResponse uses its socket for one makefile("rb") call only.
        source: Any = sock if deadline is None else _DeadlineSocket(sock, deadline)
        super().__init__(source, *args, **kwargs)
