"""The demo site as running servers: one ThreadingHTTPServer per listen address, each in a thread.

    with DemoSite(SiteConfig(port=0)) as site:
        crawl(site.config.sitemap_index_url)
        assert len(site.records()) > 0

Port 0 picks a port free on every address; `site.config` then holds it.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from demo_site.config import SiteConfig
from demo_site.routes import Answer, answer
from demo_site.state import RequestRecord, SiteState

MAX_BODY_BYTES = 65536  # control requests carry no body; a bigger one is not read in full
PORT_ATTEMPTS = 20  # a port free on the first address may be taken on another; try again


class SiteServer(ThreadingHTTPServer):
    daemon_threads = True  # a slow or stuck client never holds up stop()
    allow_reuse_address = True  # restart at once on the same port after a stop

    def __init__(self, address: tuple[str, int], site: DemoSite, default_site: int) -> None:
        self.site = site
        self.default_site = default_site
        super().__init__(address, RequestHandler)


class RequestHandler(BaseHTTPRequestHandler):
    server: SiteServer
    server_version = "DemoSite/1"

    def do_GET(self) -> None:
        self._handle(send_body=True)

    def do_HEAD(self) -> None:
        self._handle(send_body=False)

    def do_POST(self) -> None:
        self._handle(send_body=True)

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: the structured request log replaces the default stderr line per request."""

    def _handle(self, send_body: bool) -> None:
        # Read any request body: closing a socket with unread input can reset the connection
        # before the client has read the answer.
        length = self.headers.get("Content-Length", "")
        if length.isdigit():
            self.rfile.read(min(int(length), MAX_BODY_BYTES))
        site = self.server.site
        config = site.config
        index = self._site_index(config)
        result = answer(config, site.state, index, self.command, self.path)
        if result.delay_s:
            time.sleep(result.delay_s)
        # Recorded before the answer goes out: once a client has its response, the log has it too.
        record = RequestRecord(time.time(), config.netloc(index), self.command, self.path, int(result.status))
        site.state.record(record)
        self._send(result, send_body)

    def _site_index(self, config: SiteConfig) -> int:
        """Which site host was asked: the Host header when it names one, else this listener's."""
        host = self.headers.get("Host", "").rsplit(":", 1)[0].lower()
        if host in config.names:
            return config.names.index(host)
        return self.server.default_site

    def _send(self, result: Answer, send_body: bool) -> None:
        self.send_response(result.status)
        self.send_header("Content-Type", result.content_type)
        self.send_header("Content-Length", str(len(result.body)))
        self.end_headers()
        if send_body:
            self.wfile.write(result.body)


class DemoSite:
    """Start with `start()` (or `with`), stop with `stop()`. `config.port` 0 picks a free port;
    after start, `config` holds the port in use, so its URLs and `expected()` are right."""

    def __init__(self, config: SiteConfig | None = None, log_path: str | Path | None = None) -> None:
        self.config = config or SiteConfig()
        self._log_path = Path(log_path) if log_path else None
        self._log_file: TextIO | None = None
        self.state = SiteState()
        self._servers: list[SiteServer] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> DemoSite:
        if self._servers:
            raise RuntimeError("demo site already started")
        if self._log_path is not None:
            self._log_file = self._log_path.open("a", encoding="utf-8")
        self.state = SiteState(self._log_file)
        try:
            self._servers = self._bind()
        except OSError:
            self._close_log()
            raise
        for server in self._servers:
            host, port = server.server_address[:2]
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name=f"demo-site-{host!s}:{port}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        # shutdown() waits up to one poll interval; asking every server at once waits that once.
        stoppers = [threading.Thread(target=server.shutdown) for server in self._servers]
        for stopper in stoppers:
            stopper.start()
        for thread in [*stoppers, *self._threads]:
            thread.join()
        for server in self._servers:
            server.server_close()
        self._servers, self._threads = [], []
        self._close_log()

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def records(self) -> list[RequestRecord]:
        """Every request answered so far, oldest first."""
        return self.state.records()

    def fix(self) -> None:
        """What `POST /__control/fix` does, for in-process callers."""
        self.state.fix()

    def reset(self) -> None:
        """What `POST /__control/reset` does, for in-process callers."""
        self.state.reset()

    def _bind(self) -> list[SiteServer]:
        if self.config.port != 0:
            return self._bind_all(self.config.port)
        for _ in range(PORT_ATTEMPTS):
            try:
                return self._bind_all(0)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise OSError(errno.EADDRINUSE, "no port free on every demo site address")

    def _bind_all(self, port: int) -> list[SiteServer]:
        """One server per address, all on one port: the first address picks it when `port` is 0."""
        config = self.config
        one_per_name = len(config.hosts) == len(config.names)
        servers: list[SiteServer] = []
        try:
            for index, host in enumerate(config.hosts):
                servers.append(SiteServer((host, port), self, index if one_per_name else 0))
                port = servers[0].server_address[1]
        except OSError:
            for server in servers:
                server.server_close()
            raise
        self.config = dataclasses.replace(config, port=port)
        return servers

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
