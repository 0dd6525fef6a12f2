"""The /metrics endpoint's HTTP server, on a thread that sleeps until a scrape or a shutdown.

prometheus_client's start_http_server runs socketserver's serve_forever, which wakes twice a
second to see whether shutdown() was called, scraped or not: about a third of the wake-ups of a
worker whose every URL waits for a polite slot, which are its cost for the whole of a slow
crawl. This server's thread waits in select() on the listening socket and on a socket pair
that shutdown() writes to, so it wakes only for those. Requests are served as
prometheus_client serves them: its WSGI app, a thread each.
"""

from __future__ import annotations

import selectors
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged: one line per scrape would drown the service's own lines."""


class MetricsServer(ThreadingWSGIServer):
    # handle_request() is called only once select() found a connection waiting; should it be
    # gone by then, the call returns instead of blocking the thread until the next one.
    timeout = 0.0

    def __init__(self, family: socket.AddressFamily, address: tuple[str, int]) -> None:
        self.address_family = family  # read by the base class as it makes the socket
        self._stopping = False
        # First: a base class that cannot bind calls server_close(), which closes these too.
        self._wake_reader, self._wake_writer = socket.socketpair()
        super().__init__(address, _QuietHandler)
        self._thread = threading.Thread(target=self._serve, name="metrics-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving, and wait for the server's thread to end."""
        self._stopping = True
        self._wake_writer.send(b"\0")
        if self._thread.is_alive():
            self._thread.join()

    def server_close(self) -> None:
        super().server_close()
        self._wake_reader.close()
        self._wake_writer.close()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while not self._stopping:
                ready = selector.select()  # no timeout: a request or shutdown() wakes it
                if not self._stopping and any(key.fileobj is self for key, _events in ready):
                    self.handle_request()


def serve_metrics(host: str, port: int, registry: Collector) -> MetricsServer:
    """Serve `registry` on http://host:port/metrics (any path, as prometheus_client does) from
    a daemon thread; OSError if the address cannot be used."""
    family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server = MetricsServer(family, (str(sockaddr[0]), port))
    server.set_app(make_wsgi_app(registry))
    server.start()
    return server
