"""A small local site that logs every request it gets: when, on which address, which path.

    with LoggedSite(pages_route) as site:
        ... crawl site.url("/p/1") ...
        times = [hit.at for hit in site.hits_for(site.url("/"))]

It listens on one or more loopback addresses (127.0.0.x) sharing one port, so that each
address is a separate domain to the crawler. `route(hit)` decides each answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

PAGE = "<html><head><title>{path}</title></head><body><h1>{path}</h1><p>{filler}</p></body></html>"
BIND_ATTEMPTS = 20


@dataclass(frozen=True)
class Hit:
    at: float  # time.monotonic() when the request line and headers had arrived
    domain: str  # address:port the request was sent to
    path: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[[Hit], Answer]


def page(path: str, size: int = 200) -> Answer:
    html = PAGE.format(path=path, filler="x" * size)
    return Answer(200, html.encode(), {"Content-Type": "text/html; charset=utf-8"})


def pages_route(hit: Hit) -> Answer:
    """robots.txt allowing everything, and a small HTML page at every other path."""
    if hit.path == "/robots.txt":
        return Answer(200, b"User-agent: *\nAllow: /\n", {"Content-Type": "text/plain"})
    return page(hit.path)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog is 5. A crawler that opens more connections at once than
    # the accepting thread takes (Scrapy's first burst, with this process busy) then overflows
    # it: the client believes the connection open, the kernel drops its request, and the client
    # resends it on a backoff of seconds to minutes.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], site: LoggedSite) -> None:
        self.site = site
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as real sites do
    timeout = 30  # an idle keep-alive connection (and its thread) goes after this many seconds
    disable_nagle_algorithm = True  # headers and body go in two writes; don't hold the second

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: LoggedSite.hits is the log."""

    def do_GET(self) -> None:
        host, port = self.server.server_address[:2]
        domain = f"{host!s}:{port}"  # host is a str for AF_INET servers
        hit = Hit(time.monotonic(), domain, self.path, dict(self.headers.items()))
        answer = self.server.site.record(hit)
        self.send_response(answer.status)
        headers = {"Content-Length": str(len(answer.body)), **answer.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if answer.body:
            self.wfile.write(answer.body)


class LoggedSite:
    def __init__(self, route: Route = pages_route, addresses: Sequence[str] = ("127.0.0.1",)) -> None:
        self.route = route
        self.addresses = list(addresses)
        self.port = 0
        self._hits: list[Hit] = []
        self._lock = threading.Lock()
        self._servers: list[_Server] = []

    def record(self, hit: Hit) -> Answer:
        with self._lock:
            self._hits.append(hit)
        return self.route(hit)

    @property
    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def domains(self) -> list[str]:
        return [f"{address}:{self.port}" for address in self.addresses]

    def url(self, path: str, address: str | None = None) -> str:
        return f"http://{address or self.addresses[0]}:{self.port}{path}"

    def start(self) -> LoggedSite:
        for _ in range(BIND_ATTEMPTS):
            try:
                self._bind_all()
                break
            except OSError:  # the port was free on the first address only; pick another
                self._close()
        else:
            raise OSError(f"no port free on all of {self.addresses}")
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def _bind_all(self) -> None:
        self.port = 0
        for address in self.addresses:
            server = _Server((address, self.port), self)
            self.port = server.server_address[1]
            self._servers.append(server)

    def _close(self) -> None:
        for server in self._servers:
            server.server_close()
        self._servers = []

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
        self._close()

    def __enter__(self) -> LoggedSite:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def most_in_any_window(times: Sequence[float], window_s: float = 1.0) -> int:
    """The largest number of `times` inside any half-open window [t, t + window_s)."""
    ordered = sorted(times)
    most = 0
    end = 0
    for start, t in enumerate(ordered):
        while end < len(ordered) and ordered[end] < t + window_s:
            end += 1
        most = max(most, end - start)
    return most
