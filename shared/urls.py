"""URL canonicalisation and fingerprints.

Two spellings of the same page must dedupe to one task, so every URL that enters the pipeline
goes through `canonicalize` first. Anything that is not a fetchable http(s) URL is refused here,
with InvalidURL, before it costs a queue slot. On arbitrary text nothing but InvalidURL escapes.

A host that spells an IPv4 address in one of the old forms resolvers still accept (`2130706433`,
`0x7f000001`, `0177.0.0.1`, `127.1`) is rewritten to the dotted quad it means, so that one
address has one spelling for dedup and for the address guard (shared/http/netguard.py).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

from w3lib.url import canonicalize_url

from shared.errors import PermanentError

MAX_URL_CHARS = 2048  # what browsers and most servers accept in practice
DEFAULT_PORTS = {"http": 80, "https": 443}
# Schemes named in an error; any other shows as "other", so hostile input cannot grow the
# table of invalid-URL reasons without bound.
_NAMED_SCHEMES = frozenset(
    {"ftp", "ftps", "file", "mailto", "javascript", "data", "tel", "sms", "ws", "wss", "urn"}
)
FINGERPRINT_BYTES = 10
# A host after IDNA encoding: dot-separated labels of letters, digits, '-' and '_' (some real
# hosts have underscores), an optional root dot; or a bracketed IPv6 literal.
_WHITESPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")
_HOST = re.compile(r"(?:[a-z0-9_-]+\.)*[a-z0-9_-]+\.?|\[[0-9a-f:.]+\]")
# A last label that looks like a number makes the whole host an IPv4 address (as browsers and
# inet_aton read it), never a name: no top-level domain is numeric.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*", re.IGNORECASE)
_IPV4_PARTS_MAX = 4
# A URL already in canonical form, as most sitemap URLs are: lower-case http(s), a host of
# lower-case letters, digits and inner hyphens, a port without leading zeros, and a path of
# unreserved characters; no query, fragment, percent sign, user info or empty host label. For
# these `canonicalize` skips w3lib, which would come to the same result after about 25 µs of
# work; a unit test checks on generated URLs that both ways agree.
_PLAIN_URL = re.compile(
    r"(https?)://((?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)"
    r"(?::([1-9][0-9]{0,4}))?(/[A-Za-z0-9._~/-]*)?"
)
_DOT_SEGMENT = re.compile(r"/\.\.?(?:/|$)")  # '.' and '..' segments, which the full way resolves


class InvalidURL(PermanentError):
    """A URL the pipeline will not fetch; `detail` says what is wrong, never the URL itself, so
    counts of reasons stay a short list."""

    def __init__(self, detail: str) -> None:
        super().__init__("invalid_url", detail)


def canonicalize(url: str) -> str:
    """The one spelling of `url` used for dedup and fetching.

    Lowercase scheme and host, default port dropped, dot segments resolved, empty path as '/',
    percent-encoding normalised, query arguments sorted, fragment dropped. Surrounding
    whitespace is ignored, as browsers do; whitespace inside is an error.
    """
    if not isinstance(url, str):
        raise InvalidURL("not a string")
    url = url.strip()
    return _plain_canonical(url) or _canonicalize_in_full(url)


def _canonicalize_in_full(url: str) -> str:
    _check_text(url)
    parts = _split(url)
    _check_host_before_decoding(parts)
    try:
        canonical = canonicalize_url(url)
    except Exception as exc:  # w3lib raises assorted errors on odd hosts; one reason for all
        raise InvalidURL(f"cannot be parsed ({exc.__class__.__name__})") from None
    # w3lib keeps scheme, host and port as they were checked above: no second full check.
    result = urlunsplit(_without_default_port(urlsplit(canonical), parts.scheme.lower()))
    if len(result) > MAX_URL_CHARS:
        raise InvalidURL(f"longer than {MAX_URL_CHARS} characters once percent-encoded")
    return result


def _plain_canonical(url: str) -> str | None:
    """The canonical form of a URL that needs no more than its default port dropped or an empty
    path made '/', or None when it may need more (or is invalid): then the full way decides."""
    match = _PLAIN_URL.fullmatch(url) if len(url) <= MAX_URL_CHARS else None
    if match is None:
        return None
    scheme, host, port, path = match.groups()
    if path is not None and _DOT_SEGMENT.search(path):
        return None
    if _NUMERIC_LABEL.fullmatch(host.rpartition(".")[2]) and not _is_dotted_quad(host):
        return None  # an address in an old spelling, or no address at all
    if port is not None and int(port) > 0xFFFF:
        return None
    if path and (port is None or int(port) != DEFAULT_PORTS[scheme]):
        return url  # canonical as it is
    netloc = host if port is None or int(port) == DEFAULT_PORTS[scheme] else f"{host}:{port}"
    result = f"{scheme}://{netloc}{path or '/'}"
    return result if len(result) <= MAX_URL_CHARS else None


@functools.lru_cache(maxsize=1024)  # a sitemap names few hosts, each many times
def _is_dotted_quad(host: str) -> bool:
    """`host` is an IPv4 address spelt as canonicalisation spells it (no leading zeros, 4 parts)."""
    try:
        address = ipv4_literal(host)
    except InvalidURL:
        return False
    return str(address) == host


def fingerprint(canonical: str) -> bytes:
    """A 10-byte digest of a canonical URL.

    80 bits: among n URLs the chance of any two sharing a fingerprint is about n²/2^81, i.e.
    about 4e-9 for 100 million URLs, so a collision (one URL wrongly taken for a duplicate) is
    not worth storing whole URLs for. Dedup uses the first 2 bytes to pick one of 65,536 small
    Redis hashes and the other 8 as the field inside it.
    """
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=FINGERPRINT_BYTES).digest()


# A worker asks for the domain of the URL it handles four times a handling (its holds, robots.txt
# twice, the gate), about 5 us each: remembered for the URLs of the last handlings. A URL that
# raises is not remembered, and raises again.
@functools.lru_cache(maxsize=1024)
def domain_of(url: str) -> str:
    """host[:port] of a canonical URL in lower case, default port left out: the unit that
    politeness limits apply to."""
    parts = _split(url.strip())
    host = _host_for_netloc(parts.hostname or "")
    port = _port(parts)
    if port is None or port == DEFAULT_PORTS.get(parts.scheme.lower()):
        return host
    return f"{host}:{port}"


def ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address `host` spells, in any form a resolver accepts; None for a host name.

    Parts may be decimal, octal (leading 0) or hex (0x); fewer than four parts fill the last
    one's bytes ('127.1' is 127.0.0.1, '2130706433' too). One trailing dot is ignored. A host
    whose last label is numeric but that is no valid address raises InvalidURL.
    """
    labels = host.lower().removesuffix(".").split(".")
    if not _NUMERIC_LABEL.fullmatch(labels[-1]):
        return None
    numbers = [_ipv4_part(label) for label in labels]
    if len(numbers) > _IPV4_PARTS_MAX or any(n is None for n in numbers):
        raise InvalidURL("invalid host (numeric, but not an IPv4 address)")
    *leading, last = [n for n in numbers if n is not None]
    if any(n > 0xFF for n in leading) or last >= 1 << (8 * (_IPV4_PARTS_MAX - len(leading))):
        raise InvalidURL("invalid host (numeric, but not an IPv4 address)")
    value = last
    for index, number in enumerate(leading):
        value |= number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _ipv4_part(label: str) -> int | None:
    """One dot-separated part as inet_aton reads it, or None when it is no number."""
    if label.startswith("0x"):
        digits, base = label[2:] or "0", 16
    elif len(label) > 1 and label.startswith("0"):
        digits, base = label[1:], 8
    else:
        digits, base = label, 10
    allowed = "0123456789abcdef"[:base]
    if not digits or any(c not in allowed for c in digits):
        return None
    return int(digits, base)


def _check_text(url: str) -> None:
    if not url:
        raise InvalidURL("empty")
    if len(url) > MAX_URL_CHARS:
        raise InvalidURL(f"longer than {MAX_URL_CHARS} characters")
    if _WHITESPACE_OR_CONTROL.search(url):
        raise InvalidURL("contains whitespace or control characters")


def _split(url: str) -> SplitResult:
    """Split and check the parts every fetchable URL must have."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced '[' in the host
        raise InvalidURL("cannot be parsed (malformed host)") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise InvalidURL("no scheme (expected http:// or https://)")
    if scheme not in DEFAULT_PORTS:
        shown = repr(scheme) if scheme in _NAMED_SCHEMES else "(other)"
        raise InvalidURL(f"scheme {shown} not http/https")
    if parts.username is not None or parts.password is not None:
        raise InvalidURL("credentials in URL")
    if not parts.hostname:
        raise InvalidURL("no host")
    _port(parts)
    return parts


def _port(parts: SplitResult) -> int | None:
    try:
        port = parts.port
    except ValueError:
        raise InvalidURL("invalid port") from None
    if port == 0:  # nothing listens there; a connect to it only fails
        raise InvalidURL("invalid port")
    return port


def _host_for_netloc(host: str) -> str:
    host = host.lower()
    return f"[{host}]" if ":" in host else host  # IPv6 literals keep their brackets


def _check_host_before_decoding(parts: SplitResult) -> None:
    """Refuse, with their own reasons, the hosts w3lib 2.6 and later would decode or refuse
    itself: a percent-encoded host (which it decodes, as browsers do; we refuse a host that
    hides its name) and a numeric one that is no IPv4 address (which it refuses with a
    ValueError of its own)."""
    host = parts.hostname or ""
    if "%" in host:
        raise InvalidURL("invalid host")
    if not host.startswith("[") and ":" not in host:
        ipv4_literal(host)


def _without_default_port(parts: SplitResult, scheme: str) -> SplitResult:
    host = _host_for_netloc(parts.hostname or "")
    if not _HOST.fullmatch(host):
        raise InvalidURL("invalid host")
    address = None if host.startswith("[") else ipv4_literal(host)
    if address is not None:
        host = str(address)
    port = _port(parts)
    netloc = host if port is None or port == DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return parts._replace(scheme=scheme, netloc=netloc, path=parts.path or "/", fragment="")
