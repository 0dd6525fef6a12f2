"""Which addresses a fetch must not reach, and the operator's exceptions (docs/SECURITY.md).

`blocked_reason` names the special-purpose block an address is in (IANA's registries: loopback,
private, link-local, documentation, ...), judging an IPv6 address that carries an IPv4 one by
the IPv4 address. `AddressPolicy` applies BLOCK_PRIVATE_ADDRESSES and FETCH_ALLOWLIST on top.
`literal_address` reads a host written as an address in every spelling resolvers accept. Nothing
here touches the network: the guard that applies these rules where connections are made is
shared/http/netguard.py.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from dataclasses import dataclass

from shared.errors import ConfigError
from shared.urls import InvalidURL, ipv4_literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_v4 = ipaddress.IPv4Network
_v6 = ipaddress.IPv6Network
# IANA's special-purpose registries, and what each block is. Anything listed is refused.
_BLOCKED_IPV4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_v4("0.0.0.0/8"), "unspecified ('this network': 0.0.0.0 reaches this machine)"),
    (_v4("10.0.0.0/8"), "private"),
    (_v4("100.64.0.0/10"), "shared address space (carrier-grade NAT)"),
    (_v4("127.0.0.0/8"), "loopback"),
    (_v4("169.254.0.0/16"), "link-local (cloud metadata lives here)"),
    (_v4("172.16.0.0/12"), "private"),
    (_v4("192.0.0.0/24"), "IETF protocol assignments"),
    (_v4("192.0.2.0/24"), "documentation"),
    (_v4("192.88.99.0/24"), "6to4 relay anycast (deprecated)"),
    (_v4("192.168.0.0/16"), "private"),
    (_v4("198.18.0.0/15"), "benchmarking"),
    (_v4("198.51.100.0/24"), "documentation"),
    (_v4("203.0.113.0/24"), "documentation"),
    (_v4("224.0.0.0/4"), "multicast"),
    (_v4("240.0.0.0/4"), "reserved (and broadcast)"),
)
# The public IPv6 internet is 2000::/3; inside it these are not public, outside it nothing is.
_GLOBAL_UNICAST = _v6("2000::/3")
_BLOCKED_IPV6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_v6("::/128"), "unspecified"),
    (_v6("::1/128"), "loopback"),
    (_v6("64:ff9b:1::/48"), "local-use NAT64"),
    (_v6("fc00::/7"), "unique local (private)"),
    (_v6("fe80::/10"), "link-local"),
    (_v6("fec0::/10"), "site-local (deprecated)"),
    (_v6("ff00::/8"), "multicast"),
    (_v6("2001::/23"), "IETF protocol assignments (Teredo among them)"),
    (_v6("2001:db8::/32"), "documentation"),
    (_v6("3fff::/20"), "documentation"),
)
_NAT64 = _v6("64:ff9b::/96")
_HOST_NAME = re.compile(r"\.?(?:[a-z0-9_-]+\.)*[a-z0-9_-]+")


def blocked_reason(address: IPAddress) -> str | None:
    """Why nothing may connect to `address` (e.g. 'loopback'), or None when it is public.

    An IPv6 address that carries an IPv4 one (IPv4-mapped, NAT64, 6to4) is judged by that
    IPv4 address, since that is where packets to it end up.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return next((why for net, why in _BLOCKED_IPV4 if address in net), None)
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        inner = blocked_reason(embedded)
        return f"{inner}, as IPv4 {embedded} inside IPv6" if inner else None
    listed = next((why for net, why in _BLOCKED_IPV6 if address in net), None)
    if listed is None and address not in _GLOBAL_UNICAST:
        return "not global unicast (outside 2000::/3)"
    return listed


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


@dataclass(frozen=True)
class Allowlist:
    """Networks and host names the guard lets through. A name with a leading dot allows that
    domain and every name under it."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    def allows_host(self, host: str) -> bool:
        if host in self.hosts:
            return True
        return any(name.startswith(".") and f".{host}".endswith(name) for name in self.hosts)

    def allows_address(self, address: IPAddress) -> bool:
        # An IPv4-mapped address is the IPv4 address itself on a dual-stack socket.
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return any(a in net for net in self.networks for a in (address, mapped) if a is not None)


def parse_allowlist(text: str) -> Allowlist:
    """'10.1.0.0/16, intranet.example, .corp.example' -> Allowlist; ConfigError names a bad entry."""
    networks: list[Network] = []
    hosts: set[str] = set()
    for raw in text.split(","):
        entry = raw.strip().lower().removesuffix(".")
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        if "/" in entry or not _HOST_NAME.fullmatch(entry) or _spells_ipv4(entry.lstrip(".")):
            raise ConfigError(f"FETCH_ALLOWLIST: {raw.strip()!r} is neither a CIDR network nor a host name")
        hosts.add(entry)
    return Allowlist(tuple(networks), frozenset(hosts))


def _spells_ipv4(host: str) -> bool:
    try:
        return ipv4_literal(host) is not None
    except InvalidURL:
        return True


@dataclass(frozen=True)
class AddressPolicy:
    """What the guard refuses: with `block_private` off, nothing."""

    block_private: bool = True
    allowlist: Allowlist = Allowlist()

    def refusal(self, address: IPAddress) -> str | None:
        """Why `address` is refused, or None."""
        if not self.block_private or self.allowlist.allows_address(address):
            return None
        return blocked_reason(address)


def normalize_host(host: str) -> str:
    """The host as resolvers see it: no brackets, lower case, no root dot, IDNA-encoded."""
    host = host.strip("[]").lower().removesuffix(".")
    if not host.isascii():
        # The codec getaddrinfo itself applies: '１２７．０．０．１' is 127.0.0.1 to it. A host it
        # cannot encode is found by no resolver, and its connection fails on its own.
        with contextlib.suppress(UnicodeError):
            host = host.encode("idna").decode("ascii")
    return host


def literal_address(host: str) -> IPAddress | None:
    """The address a host spells (any IPv4 spelling, or IPv6), None for a name; InvalidURL for a
    host that looks numeric but is no address."""
    host = normalize_host(host)
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        if ":" in host:
            raise InvalidURL("invalid host (malformed IPv6 address)") from None
    return ipv4_literal(host)
