"""A small SOCKS5 proxy for tests (RFC 1928, with RFC 1929 user/password), on a free port of
127.0.0.1, in daemon threads. It serves CONNECT only, to loopback addresses only, and records
each target as the client named it: a host name for socks5h://, an address for socks5://.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import socketserver
import struct
import threading
from typing import Any

HOST = "127.0.0.1"
VERSION, AUTH_VERSION = 5, 1
NO_AUTH, USER_PASSWORD, NO_ACCEPTABLE = 0, 2, 0xFF
CONNECT = 1
IPV4, DOMAIN, IPV6 = 1, 3, 4
SUCCEEDED, NOT_ALLOWED, REFUSED, UNSUPPORTED = 0, 2, 5, 7


class SocksProxy:
    def __init__(self, user: str = "", password: str = "") -> None:
        self.user, self.password = user, password
        self.targets: list[tuple[str, int]] = []  # as named by clients, in order
        self.refused_logins = 0
        self._lock = threading.Lock()
        self._server: _Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start the proxy first"
        return int(self._server.server_address[1])

    def url(self, scheme: str = "socks5h") -> str:
        login = f"{self.user}:{self.password}@" if self.user else ""
        return f"{scheme}://{login}{HOST}:{self.port}"

    def start(self) -> SocksProxy:
        self._server = _Server(self)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def record(self, target: tuple[str, int]) -> None:
        with self._lock:
            self.targets.append(target)

    def refused(self) -> None:
        with self._lock:
            self.refused_logins += 1


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, proxy: SocksProxy) -> None:
        self.proxy = proxy
        super().__init__((HOST, 0), _Session)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Silenced: clients hanging up is normal here."""


class _Session(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        client: socket.socket = self.request
        proxy = self.server.proxy
        version, count = _read(client, 2)
        methods = set(_read(client, count))
        wanted = USER_PASSWORD if proxy.user else NO_AUTH
        if version != VERSION or wanted not in methods:
            client.sendall(bytes([VERSION, NO_ACCEPTABLE]))
            return
        client.sendall(bytes([VERSION, wanted]))
        if wanted == USER_PASSWORD and not self._login(client, proxy):
            return
        _version, command, _reserved, kind = _read(client, 4)
        if kind == IPV4:
            host = str(ipaddress.IPv4Address(_read(client, 4)))
        elif kind == IPV6:
            host = str(ipaddress.IPv6Address(_read(client, 16)))
        else:
            host = _read(client, _read(client, 1)[0]).decode()
        (port,) = struct.unpack("!H", _read(client, 2))
        proxy.record((host, port))
        if command != CONNECT:
            client.sendall(_reply(UNSUPPORTED))
            return
        address = HOST if host == "localhost" else host
        if not ipaddress.ip_address(address).is_loopback:  # tests never leave the machine
            client.sendall(_reply(NOT_ALLOWED))
            return
        try:
            upstream = socket.create_connection((address, port), timeout=5)
        except OSError:
            client.sendall(_reply(REFUSED))
            return
        with upstream:
            client.sendall(_reply(SUCCEEDED))
            _relay(client, upstream)

    @staticmethod
    def _login(client: socket.socket, proxy: SocksProxy) -> bool:
        _version, length = _read(client, 2)
        user = _read(client, length).decode()
        password = _read(client, _read(client, 1)[0]).decode()
        accepted = (user, password) == (proxy.user, proxy.password)
        client.sendall(bytes([AUTH_VERSION, 0 if accepted else 1]))
        if not accepted:
            proxy.refused()
        return accepted


def _read(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client hung up")
        data += chunk
    return data


def _reply(code: int) -> bytes:
    return bytes([VERSION, code, 0, IPV4]) + socket.inet_aton("0.0.0.0") + struct.pack("!H", 0)


def _relay(one: socket.socket, other: socket.socket) -> None:
    peers = {one: other, other: one}
    while True:
        readable, _, _ = select.select(list(peers), [], [], 30)
        if not readable:
            return
        for source in readable:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            peers[source].sendall(data)
