"""The address guard: no fetch connects to loopback, private, link-local or other internal
addresses, unless the operator allows them (docs/SECURITY.md).

URLs come from strangers (sitemaps, redirects). Fetching `http://169.254.169.254/` or
`http://localhost:6379/` on their word would let them read our own network (server-side request
forgery). Checking the URL's text is not enough: a name can resolve to 127.0.0.1, and DNS can
answer differently between a check and the connect that follows (DNS rebinding). So the check
runs where the connection is made:

  * `GuardedAdapter`, a requests transport adapter, resolves the host itself, refuses it if ANY
    of its addresses is blocked, and connects to an address it has just checked (how urllib3 is
    made to connect there: shared/http/urllib3_compat.py). DNS is asked once per connection, so there
    is no second answer to rebind. TLS SNI, certificate checks and the Host header still use the
    host name. Each redirect hop opens its own checked connection.
  * `check_url` is the cheap early check for each hop: addresses written in the URL, in every
    spelling resolvers accept (`0x7f000001`, `2130706433`, `0177.0.0.1`, `127.1`, `[::ffff:
    127.0.0.1]`), are refused before any request is made.

Which addresses are refused, and how a host spelled as an address is read: shared/http/addresses.py.
Entry points: `guarded_session(settings)` and `check_url(settings)`. A refused URL raises
BlockedAddress (reason `blocked_address`), a PermanentError: retrying cannot help.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests
import requests.adapters
from requests.utils import select_proxy
from urllib3.connection import HTTPConnection
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import create_connection

from shared.errors import BlockedAddress
from shared.http import urllib3_compat
from shared.http.addresses import AddressPolicy, IPAddress, literal_address, normalize_host, parse_allowlist
from shared.http.deadline import DeadlineHTTPResponse, clipped_timeout, current_deadline
from shared.urls import DEFAULT_PORTS, InvalidURL

if TYPE_CHECKING:
    from shared.settings import Settings

log = logging.getLogger("shared.netguard")  # the name operators know: kept as the module moved

Resolver = Callable[[str, int], Sequence[str]]
"""(host name, port) -> the IP addresses to connect to, as text; raises OSError when the name
does not resolve. Tests pass a dictionary lookup instead of DNS."""

SocketOpener = Callable[[tuple[str, int], Any, Any, Any], socket.socket]
"""Connects to ((ip, port), timeout, source_address, socket_options): urllib3's
create_connection by default; given an IP it asks no DNS."""

UrlCheck = Callable[[str], None]

_LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


def system_resolver(host: str, port: int) -> list[str]:
    """Every address getaddrinfo gives for `host`, in its order, without repeats."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class AddressGuard:
    """Applies an AddressPolicy to URLs and to the addresses a host resolves to."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver = system_resolver) -> None:
        self.policy = policy
        self._resolver = resolver

    def check_url(self, url: str, resolve: bool = False) -> None:
        """Raise BlockedAddress when `url`'s host is refused (InvalidURL when it has none).

        Without `resolve`, only an address written in the URL is judged and a host name is left
        to the connection-time check; with it the name is resolved and judged too, and a name
        that does not resolve passes (its connection fails by itself).
        """
        host, port = _host_and_port(url)
        if not resolve:
            self._judge(host, _LOOPBACK if _is_localhost(host) else literal_address(host))
            return
        with contextlib.suppress(OSError):
            self.addresses_for(host, port)

    def addresses_for(self, host: str, port: int) -> list[IPAddress]:
        """The addresses to connect to for host:port, every one judged. Raises BlockedAddress if
        any is refused (one bad answer among good ones is how rebinding attacks start), and
        socket.gaierror when the name does not resolve."""
        host = normalize_host(host)
        literal = literal_address(host)
        if literal is not None:
            self._judge(host, literal)
            return [literal]
        if _is_localhost(host):
            self._judge(host, _LOOPBACK)  # whatever a resolver would say
        answers = self._resolver(host, port)
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, f"no address for {host}")
        addresses = [_answer_address(host, answer) for answer in answers]
        for address in addresses:
            self._judge(host, address)
        return addresses

    def _judge(self, host: str, address: IPAddress | None) -> None:
        host = normalize_host(host)
        if address is None or self.policy.allowlist.allows_host(host):
            return
        reason = self.policy.refusal(address)
        if reason is not None:
            log.debug("refused %s (%s): %s", host, address, reason)
            shown = "" if literal_address(host) == address else f"{host} -> "
            raise BlockedAddress(f"{shown}{address} is {reason}")


def _is_localhost(host: str) -> bool:
    """'localhost' and names under it are loopback by definition (RFC 6761)."""
    return normalize_host(host).rpartition(".")[2] == "localhost"


def _answer_address(host: str, answer: str) -> IPAddress:
    try:
        return ipaddress.ip_address(answer)
    except ValueError:  # a resolver that answers nonsense is not trusted with anything
        raise BlockedAddress(f"{host} resolved to {answer!r}, not an address") from None


def _host_and_port(url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidURL("cannot be parsed (malformed host or port)") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise InvalidURL("not an http(s) URL with a host")
    return parts.hostname, port or DEFAULT_PORTS[scheme]


# --- Transport: requests -> urllib3 pools -> connections that connect through the guard --------


@dataclass(frozen=True)
class _Connector:
    """Where a guarded connection may connect (shared/http/urllib3_compat.py asks it)."""

    guard: AddressGuard
    open_socket: SocketOpener

    def addresses(self, connection: HTTPConnection) -> list[IPAddress]:
        try:
            return self.guard.addresses_for(connection.host, connection.port)
        except socket.gaierror as exc:
            raise NameResolutionError(connection.host, connection, exc) from exc

    def attempt_timeout(self, connection: HTTPConnection) -> Any:
        # Each attempt waits at most until the deadline of the fetch this connection is made for
        # (shared/http/deadline.py); the socket keeps that timeout for the TLS handshake, which
        # Python bounds as a whole.
        return clipped_timeout(connection.timeout, current_deadline())

    def connect(self, connection: HTTPConnection) -> socket.socket:
        """What urllib3's HTTPConnection._new_conn does, with the addresses chosen by the guard
        and its errors translated the same way."""
        host, port = connection.host, connection.port
        addresses = self.addresses(connection)
        try:
            error: OSError = OSError(f"no address to connect to for {host}")
            for address in addresses:
                target = (str(address), port)
                timeout = self.attempt_timeout(connection)
                try:
                    return self.open_socket(
                        target, timeout, connection.source_address, connection.socket_options
                    )
                except OSError as exc:
                    error = exc
            raise error
        except TimeoutError as exc:
            raise ConnectTimeoutError(connection, f"connection to {host} timed out") from exc
        except OSError as exc:
            raise NewConnectionError(connection, f"failed to connect to {host}: {exc}") from exc


class GuardedAdapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose every connection goes through an AddressGuard.

    A request sent through a proxy connects to the proxy (an address the operator chose), so
    the target's name is resolved and judged here before the request goes out.
    """

    def __init__(
        self,
        guard: AddressGuard,
        open_socket: SocketOpener = create_connection,
        pool_hosts: int = requests.adapters.DEFAULT_POOLSIZE,
        pool_size: int = requests.adapters.DEFAULT_POOLSIZE,
        private_api: bool = True,
    ) -> None:
        self.guard = guard
        # Before super(), which builds the pools: the classes their connections are made with.
        # Their responses' reads (headers and body) end at the fetch's deadline, not only each
        # within a timeout.
        self._pool_classes = urllib3_compat.pool_classes(
            _Connector(guard, open_socket), DeadlineHTTPResponse, private_api
        )
        super().__init__(pool_connections=pool_hosts, pool_maxsize=pool_size)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pool_classes

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        if request.url and proxies and select_proxy(request.url, dict(proxies)):
            self.guard.check_url(request.url, resolve=True)
        return super().send(request, stream, timeout, verify, cert, dict(proxies) if proxies else None)


def guarded_session(
    settings: Settings,
    *,
    resolver: Resolver = system_resolver,
    open_socket: SocketOpener = create_connection,
    pool_hosts: int = requests.adapters.DEFAULT_POOLSIZE,
    pool_size: int = requests.adapters.DEFAULT_POOLSIZE,
    private_api: bool = True,
) -> requests.Session:
    """A requests.Session that refuses blocked addresses (BLOCK_PRIVATE_ADDRESSES,
    FETCH_ALLOWLIST) on every connection, redirects included.

    Proxy settings in the environment are ignored: a proxy would make the connection instead of
    us. It keeps connections to the `pool_hosts` hosts used last, up to `pool_size` idle ones
    each. `resolver` and `open_socket` are seams for tests; `open_socket` is not used on
    urllib3's public path (`private_api=False`, or where its private one fails its check:
    shared/http/urllib3_compat.py).
    """
    guard = AddressGuard(address_policy(settings), resolver)
    adapter = GuardedAdapter(guard, open_socket, pool_hosts, pool_size, private_api)
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def address_policy(settings: Settings) -> AddressPolicy:
    """BLOCK_PRIVATE_ADDRESSES and FETCH_ALLOWLIST as the guard applies them. Read here, not in
    shared/http/addresses.py, which the settings' own check imports: that module knows no settings."""
    return AddressPolicy(settings.block_private_addresses, parse_allowlist(settings.fetch_allowlist))


def check_url(settings: Settings, *, resolver: Resolver | None = None) -> UrlCheck:
    """A per-hop URL check raising BlockedAddress, for worker.fetch.fetcher.Fetcher(check_url=...).

    It judges addresses written in the URL and asks no DNS: names are judged by
    guarded_session's connections. Given a `resolver`, it resolves and judges names as well.
    """
    guard = AddressGuard(address_policy(settings), resolver or system_resolver)
    return functools.partial(guard.check_url, resolve=resolver is not None)
