"""The guarded forward proxy every request of the browser goes through.

A page is many requests: subresources, XHR and fetch, iframes, websockets, redirects, a service
worker's own. Request interception inside the page can miss some of them, so Chromium is
started with `--proxy-server` pointing here and `--proxy-bypass-list=<-loopback>` (Chromium
otherwise reaches loopback directly, past any proxy). Each connection the browser asks for is
judged here by the worker's own AddressGuard (FETCH_ALLOWLIST, BLOCK_PRIVATE_ADDRESSES), on the
addresses the host resolves to at the moment of connecting, so DNS cannot rebind between check
and connect:

  * `GET http://host/...` (absolute form): only http; the request is sent on a connection of its
    own (`Connection: close`) and the answer streamed back, cut at MAX_BODY_BYTES.
  * `CONNECT host:port`: https and websockets; the tunnel's bytes towards the browser are cut at
    MAX_BODY_BYTES in all.

A refused request is answered `403` with the header `X-Render-Refused: <reason>`, so the page's
own document can be told refused (renderer/page.py) from a site's 403, and it is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.errors import BlockedAddress
from shared.http.addresses import IPAddress
from shared.urls import InvalidURL

log = logging.getLogger(__name__)

REFUSED_HEADER = "X-Render-Refused"
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers longer than this are not a browser's
CHUNK_BYTES = 64 * 1024
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never passed on to the site.
_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "upgrade"}
)

Addresses = Callable[[str, int], list[IPAddress]]
"""(host, port) -> the addresses to connect to, every one judged; raises BlockedAddress or
OSError. AddressGuard.addresses_for in service, a dictionary in tests."""

Refused = Callable[[str, str], None]
"""Told (reason, target) for each refused request: the metrics, in service."""


class _Refusal(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class ProxyFigures:
    connections: int = 0  # upstream connections made
    refused: int = 0
    cut: int = 0  # answers cut at the body cap


class GuardedProxy:
    """An asyncio server on 127.0.0.1; `start()` returns its port."""

    def __init__(
        self,
        addresses: Addresses,
        *,
        max_body_bytes: int,
        connect_timeout_s: float,
        idle_timeout_s: float,
        refused: Refused = lambda reason, target: None,
    ) -> None:
        self._addresses = addresses
        self._max_body_bytes = max_body_bytes
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._refused = refused
        self._server: asyncio.Server | None = None
        self.figures = ProxyFigures()

    async def start(self, host: str = "127.0.0.1") -> int:
        self._server = await asyncio.start_server(self._serve, host, 0, limit=MAX_HEAD_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._idle_timeout_s)
            method, target, lines = _parse_head(head)
            if method == "CONNECT":
                await self._tunnel(target, reader, writer)
            else:
                await self._forward(method, target, lines, reader, writer)
        except _Refusal as refusal:
            self.figures.refused += 1
            self._refused(refusal.reason, str(refusal))
            log.debug("refused a browser request: %s (%s)", refusal, refusal.reason)
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(
                    f"HTTP/1.1 403 Forbidden\r\n{REFUSED_HEADER}: {refusal.reason}\r\n"
                    "Content-Length: 0\r\nConnection: close\r\n\r\n".encode("ascii")
                )
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the browser went away, or stalled: nothing to answer
        finally:
            writer.close()

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to an address of `host` the guard has just judged."""
        loop = asyncio.get_running_loop()
        try:
            # getaddrinfo blocks: in the loop's executor, like any DNS asked from asyncio.
            addresses = await loop.run_in_executor(None, self._addresses, host, port)
        except BlockedAddress as exc:
            raise _Refusal("blocked_address", f"{host}:{port}: {exc.detail}") from None
        except (OSError, InvalidURL) as exc:
            raise _Refusal("unresolved", f"{host}:{port}: {exc}") from None
        last: Exception | None = None
        for address in addresses:
            try:
                opened = await asyncio.wait_for(
                    asyncio.open_connection(str(address), port), self._connect_timeout_s
                )
            except (OSError, TimeoutError) as exc:
                last = exc
                continue
            self.figures.connections += 1
            return opened
        raise OSError(f"cannot connect to {host}:{port}: {last}")

    async def _tunnel(self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = _authority(target, default_port=443)
        up_reader, up_writer = await self._open(host, port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await self._pipe_both(reader, writer, up_reader, up_writer)

    async def _forward(
        self,
        method: str,
        target: str,
        lines: list[str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise _Refusal("scheme", f"{target[:200]}: only http(s) is fetched")
        try:
            port = parts.port or 80
        except ValueError:
            raise _Refusal("bad_request", f"{target[:200]}: bad port") from None
        headers = [line for line in lines if line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
        if any(line.split(":", 1)[0].strip().lower() == "transfer-encoding" for line in headers):
            raise _Refusal("bad_request", "a chunked request body is not passed on")
        up_reader, up_writer = await self._open(parts.hostname, port)
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        head = "\r\n".join([f"{method} {path} HTTP/1.1", *headers, "Connection: close", "", ""])
        up_writer.write(head.encode("latin-1"))
        body_bytes = _content_length(headers)
        if body_bytes > self._max_body_bytes:
            up_writer.close()
            raise _Refusal("body_cap", f"a request body of {body_bytes} bytes")
        if body_bytes:
            up_writer.write(await reader.readexactly(body_bytes))
        await up_writer.drain()
        try:
            # The answer's head as it comes (bounded), then its body, counted against the cap.
            answer_head = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), self._idle_timeout_s)
            writer.write(answer_head)
            await self._copy(up_reader, writer, self._max_body_bytes)
        finally:
            up_writer.close()

    async def _pipe_both(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        towards_site = asyncio.ensure_future(self._copy(reader, up_writer, None))
        towards_browser = asyncio.ensure_future(self._copy(up_reader, writer, self._max_body_bytes))
        try:
            await asyncio.wait((towards_site, towards_browser), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (towards_site, towards_browser):
                task.cancel()
            up_writer.close()

    async def _copy(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, cap: int | None) -> None:
        sent = 0
        while True:
            chunk = await asyncio.wait_for(source.read(CHUNK_BYTES), self._idle_timeout_s)
            if not chunk:
                return
            sent += len(chunk)
            if cap is not None and sent > cap:
                self.figures.cut += 1
                self._refused("body_cap", f"an answer past {cap} bytes")
                return  # closing mid-answer: the browser sees a truncated, failed response
            sink.write(chunk)
            await sink.drain()


def _parse_head(head: bytes) -> tuple[str, str, list[str]]:
    text = head.decode("latin-1")
    request_line, *lines = [line for line in text.split("\r\n") if line]
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _Refusal("bad_request", "not an HTTP request")
    return parts[0].upper(), parts[1], lines


def _authority(target: str, default_port: int) -> tuple[str, int]:
    host, sep, port_text = target.rpartition(":")
    if not sep or not port_text.isdigit():
        host, port_text = target, str(default_port)
    host = host.strip("[]")
    port = int(port_text)
    if not host or not 0 < port < 65536:
        raise _Refusal("bad_request", f"{target[:200]}: no host and port")
    return host, port


def _content_length(headers: list[str]) -> int:
    for line in headers:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            try:
                return max(0, int(value.strip()))
            except ValueError:
                raise _Refusal("bad_request", "a Content-Length that is not a number") from None
    return 0
