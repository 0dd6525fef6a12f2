"""What every test site served from this process has in common: a threaded HTTP/1.1 server with
keep-alive on a free port of 127.0.0.1, started in a daemon thread and stopped with the test.

A site subclasses LocalSite and names its handler, a subclass of QuietHandler that reaches the
site as `self.server.site`. Clients hanging up mid-answer (a fetch past its size cap or deadline,
a killed worker) are what these sites exist to provoke, so neither that nor a request is logged.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Generic, Self, TypeVar

HOST = "127.0.0.1"

SiteT = TypeVar("SiteT", bound="LocalSite")


class LocalServer(ThreadingHTTPServer, Generic[SiteT]):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, site: SiteT, handler: type[QuietHandler]) -> None:
        self.site = site
        super().__init__((HOST, 0), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Silenced: a client that hangs up is what should happen here."""


class QuietHandler(BaseHTTPRequestHandler):
    server: LocalServer[Any]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: each site counts requests itself."""

    def send(
        self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """One whole answer; a client gone meanwhile closes the connection and is not an error."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True


class LocalSite:
    handler: ClassVar[type[QuietHandler]]

    def __init__(self) -> None:
        self._server: LocalServer[Self] | None = None

    @property
    def root(self) -> str:
        assert self._server is not None, "start the site first"
        return f"http://{HOST}:{self._server.server_address[1]}"

    def url(self, path: str) -> str:
        return self.root + path

    def start(self) -> Self:
        self._server = LocalServer(self, self.handler)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
