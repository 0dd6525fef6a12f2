"""How the address guard (shared/http/netguard.py) gets to choose where urllib3 connects: through
urllib3's private `_new_conn` where that is checked to work, through its public `connect()`
otherwise. Both connect only to an address the guard has just judged, and ask DNS once.

* Private path: the connection classes override `_new_conn`, the method urllib3's
  HTTPConnection and HTTPSConnection call from `connect()` to open their socket. The guard's
  connector opens it, through its `open_socket` seam, to an address it judged. Checked by
  version, and on first use by a probe that touches no network: connect() must reach the
  override for both schemes.
* Public path: the classes override `connect()`. The connector resolves and judges the host;
  then, for each judged address in turn, the connection's `host` becomes that address (HTTPS
  keeps the name for SNI and the certificate check through `server_hostname`) and urllib3's own
  connect() runs; `host` is the name again afterwards, for the Host header. The address is
  written out, so urllib3 asks no DNS. The `open_socket` seam is not used: urllib3 opens the
  socket.

Both raise the same errors: BlockedAddress from the guard, NameResolutionError,
NewConnectionError and ConnectTimeoutError with the same words. The pools are wired with
public attributes only (`pool_classes_by_scheme`, `ConnectionCls`); the probe checks that
wiring too, and when even the public path would not be used, `pool_classes` raises rather
than hand out connections the guard never sees.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, cast

from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

from shared.errors import PipelineError
from shared.library_checks import outside, version_of, warn_fallback

# `_new_conn` is called from connect() this way from urllib3 2.0 to 2.8 at least.
CHECKED_VERSIONS = ((2, 0), (3, 0))


class Connector(Protocol):
    def addresses(self, connection: HTTPConnection) -> Sequence[object]:
        """The judged addresses to try for the connection's host, in order (BlockedAddress when
        one is refused, NameResolutionError when there are none)."""

    def attempt_timeout(self, connection: HTTPConnection) -> Any:
        """The connection's timeout, clipped to what is left of the fetch's deadline."""

    def connect(self, connection: HTTPConnection) -> socket.socket:
        """A socket to one of `addresses`, with urllib3's errors (the private path)."""


class _Probed(PipelineError):
    """Raised by the probe's connector: proof that a connection asked it where to connect."""


class _ProbeConnector:
    def addresses(self, connection: HTTPConnection) -> Sequence[object]:
        raise _Probed

    def attempt_timeout(self, connection: HTTPConnection) -> Any:
        raise _Probed

    def connect(self, connection: HTTPConnection) -> socket.socket:
        raise _Probed


class _ViaNewConn(HTTPConnection):
    connector: ClassVar[Connector]

    def _new_conn(self) -> socket.socket:
        return self.connector.connect(self)


class _ViaNewConnTLS(HTTPSConnection):
    connector: ClassVar[Connector]

    def _new_conn(self) -> socket.socket:
        return self.connector.connect(self)


class _ViaConnect(HTTPConnection):
    connector: ClassVar[Connector]

    def connect(self) -> None:
        _connect_to_judged(self, self.connector, super().connect)


class _ViaConnectTLS(HTTPSConnection):
    connector: ClassVar[Connector]

    def connect(self) -> None:
        _connect_to_judged(self, self.connector, super().connect)


def _connect_to_judged(connection: HTTPConnection, connector: Connector, connect: Callable[[], None]) -> None:
    name, timeout = connection.host, connection.timeout
    addresses = connector.addresses(connection)
    sni = isinstance(connection, HTTPSConnection) and connection.server_hostname is None
    error: Exception = NewConnectionError(connection, f"failed to connect to {name}: no address")
    for address in addresses:
        try:
            connection.timeout = connector.attempt_timeout(connection)
            connection.host = str(address)
            if sni:
                cast(HTTPSConnection, connection).server_hostname = name
            connect()
            return
        except NameResolutionError as exc:  # an address written out needs no DNS: not expected
            error = exc
        except NewConnectionError as exc:  # the words the private path uses
            error = NewConnectionError(connection, f"failed to connect to {name}: {exc.__cause__}")
            error.__cause__ = exc.__cause__
        except ConnectTimeoutError as exc:
            error = ConnectTimeoutError(connection, f"connection to {name} timed out")
            error.__cause__ = exc.__cause__
        finally:
            connection.host, connection.timeout = name, timeout
            if sni:
                cast(HTTPSConnection, connection).server_hostname = None
    raise error


ClassesFor = Callable[[Connector], dict[str, type[Any]]]


def _classes(private: bool, connector: Connector, response_class: type | None = None) -> dict[str, type[Any]]:
    """Pool classes by scheme whose connections go through `connector`."""
    bases = (_ViaNewConn, _ViaNewConnTLS) if private else (_ViaConnect, _ViaConnectTLS)
    fields: dict[str, Any] = {"connector": connector}
    if response_class is not None:
        fields["response_class"] = response_class
    plain = type("GuardedHTTPConnection", (bases[0],), fields)
    tls = type("GuardedHTTPSConnection", (bases[1],), fields)
    return {
        "http": type("GuardedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": plain}),
        "https": type("GuardedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": tls}),
    }


def reaches_connector(classes_for: ClassesFor) -> bool:
    """Whether a PoolManager wired with `classes_for(connector)` asks the connector, for both
    schemes. The probe connects nowhere; were the connector skipped, urllib3 would meet a
    closed port on loopback (the discard port), never another host."""
    manager = PoolManager(retries=False, timeout=0.5)
    manager.pool_classes_by_scheme = classes_for(_ProbeConnector())
    try:
        for scheme in ("http", "https"):
            try:
                manager.request("GET", f"{scheme}://127.0.0.1:9/")
            except _Probed:
                continue
            except Exception:  # connected some other way, or failed: either way not through us
                return False
            return False
        return True
    finally:
        manager.clear()


def check_private_path(version: str, classes_for: ClassesFor) -> str | None:
    """Why the private path may not be used with urllib3 `version`, or None when it may."""
    why = outside(version, *CHECKED_VERSIONS)
    if why is None and not reaches_connector(classes_for):
        why = "HTTPConnection.connect() no longer opens its socket with _new_conn"
    return why


@functools.cache
def private_path_checked() -> str | None:
    """check_private_path for the installed urllib3, once a process."""
    return check_private_path(version_of("urllib3"), functools.partial(_classes, True))


@functools.cache
def _public_path_works() -> bool:
    return reaches_connector(functools.partial(_classes, False))


def pool_classes(
    connector: Connector, response_class: type | None = None, private_api: bool = True
) -> dict[str, type[Any]]:
    """For PoolManager.pool_classes_by_scheme: pools whose every connection is made through
    `connector`. `private_api=False` forces the public path."""
    why = private_path_checked() if private_api else "not wanted"
    if why is None:
        return _classes(True, connector, response_class)
    if private_api:
        warn_fallback("the guard's urllib3 connect hook (_new_conn)", why, "an override of connect()")
    if not _public_path_works():
        raise RuntimeError(
            f"urllib3 {version_of('urllib3')} does not make connections with the classes it is given: "
            "fetching would bypass the address guard"
        )
    return _classes(False, connector, response_class)
