"""A crawl request: a run to seed, handed to the producer service through the control queue.

`python -m ops.submit` and the dashboard's `POST /api/v1/runs` build one from a JSON body
(`CrawlRequest.from_json`), check it (`check`), and publish it; the producer service
(`python -m producer --serve`) decodes it, checks it again (anything with access to the broker
could have published it) and seeds the run as `python -m producer` would.

A request carries URLs and run ids only: no code, settings or file paths. Every bound is
checked before anything is queued, each failure a one-line InvalidRequest naming the field:

    body over MAX_REQUEST_BYTES, not JSON, not an object, a field not known or of the wrong type
    no URL at all (sitemaps, urls and site all empty)
    a URL that does not canonicalise (shared/urls.py), or one the address guard refuses
    a run id (or recrawl_of) that is not up to 64 letters, digits, '.', '-' or '_'
    a discovery option out of bounds: a negative count, an unknown scope, a pattern that does
    not compile (producer/discovery_scope.py says what each one does)

Fields are listed once, in `_FIELDS`, with their JSON name and kind; a new kind of input (the
discovery options of a crawl that follows links, say) is a field added there and in the class.
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.errors import BlockedAddress, ConfigError, DecodeError, InvalidMessage
from shared.message_bounds import RUN_ID_PATTERN
from shared.urls import InvalidURL, canonicalize

MAX_REQUEST_BYTES = 1024 * 1024
VERSION = 1

DISCOVERY_SCOPES = ("host", "domain", "prefix")
MAX_COUNT = 1_000_000_000  # of a depth or a budget
MAX_PATTERNS, MAX_PATTERN_CHARS = 100, 1000

UrlCheck = Callable[[str], None]  # raises BlockedAddress (shared/http/netguard.py's check_url)


class InvalidRequest(ConfigError):
    """A crawl request that cannot be queued: one line naming the field and what is wrong."""


def new_run_id() -> str:
    """e.g. 20250101-120000-3fa2c1: sortable by start time, unique across parallel starts (a
    producer started without --run-id, a request without a run id)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def new_request_id() -> str:
    return f"req-{secrets.token_hex(6)}"


@dataclass(frozen=True)
class CrawlRequest:
    run_id: str
    sitemaps: tuple[str, ...] = ()
    urls: tuple[str, ...] = ()  # page URLs to fetch as they are
    sites: tuple[str, ...] = ()  # site roots: their robots.txt Sitemap: lines, else /sitemap.xml
    recrawl_of: str | None = None  # an earlier run: publish only what changed since
    # A discovery run's (producer/discovery_scope.py): it discovers with start URLs or a depth.
    start_urls: tuple[str, ...] = ()
    max_depth: int | None = None
    scope: str = "host"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_pages: int = 100_000
    max_pages_per_host: int = 0
    request_id: str = field(default_factory=new_request_id)
    requested_at: float = field(default_factory=time.time)

    def all_urls(self) -> list[tuple[str, str]]:
        """(field and index, URL) of every URL the request holds, as errors name them."""
        return [
            (f"{name}[{index}]", url)
            for name in ("sitemaps", "urls", "sites", "start_urls")
            for index, url in enumerate(getattr(self, name))
        ]

    def encode(self) -> bytes:
        return json.dumps({"version": VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> CrawlRequest:
        """The request `body` holds; DecodeError when it is not JSON, InvalidMessage when its
        fields are not a request's."""
        try:
            data = _json_object(body)
            if data.pop("version", None) != VERSION:
                raise InvalidRequest(f"version: expected {VERSION}")
            request_id, requested_at = data.pop("request_id", None), data.pop("requested_at", None)
            if not isinstance(request_id, str) or not RUN_ID_PATTERN.fullmatch(request_id):
                raise InvalidRequest("request_id: expected a request id")
            if type(requested_at) not in (int, float):
                raise InvalidRequest("requested_at: expected epoch seconds")
            return _fields(data, data.get("run_id"), request_id, float(requested_at))
        except InvalidRequest as exc:
            if str(exc).startswith("body is not"):
                raise DecodeError(str(exc)) from None
            raise InvalidMessage(str(exc)) from None

    @classmethod
    def from_json(cls, body: bytes | Mapping[str, Any], new_run_id: Callable[[], str]) -> CrawlRequest:
        """A request from a client's JSON (bytes as received, or already parsed); a run id is
        made with `new_run_id` when it gives none. Raises InvalidRequest."""
        if isinstance(body, bytes | bytearray):
            if len(body) > MAX_REQUEST_BYTES:
                raise InvalidRequest(
                    f"request body of {len(body)} bytes, over the {MAX_REQUEST_BYTES} a request may have"
                )
            data = _json_object(bytes(body))
        elif isinstance(body, Mapping):
            data = dict(body)
            if len(json.dumps(data, default=str)) > MAX_REQUEST_BYTES:
                raise InvalidRequest(f"request over the {MAX_REQUEST_BYTES} bytes a request may have")
        else:
            raise InvalidRequest("request: expected a JSON object")
        run_id = data.get("run_id")
        return _fields(data, new_run_id() if run_id is None else run_id, new_request_id(), time.time())


# JSON name -> (attribute, kind). A JSON "site" may be one root or a list of them.
_FIELDS: dict[str, tuple[str, str]] = {
    "run_id": ("run_id", "run id"),
    "sitemaps": ("sitemaps", "urls"),
    "urls": ("urls", "urls"),
    "site": ("sites", "urls"),
    "sites": ("sites", "urls"),
    "recrawl_of": ("recrawl_of", "run id or null"),
    "start_urls": ("start_urls", "urls"),
    "start": ("start_urls", "urls"),
    "max_depth": ("max_depth", "count or null"),
    "scope": ("scope", "scope"),
    "include": ("include", "patterns"),
    "exclude": ("exclude", "patterns"),
    "max_pages": ("max_pages", "count"),
    "max_pages_per_host": ("max_pages_per_host", "count"),
}


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest(f"body is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise InvalidRequest("body is not a JSON object")
    return data


def _fields(data: dict[str, Any], run_id: object, request_id: str, requested_at: float) -> CrawlRequest:
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in _FIELDS:
            known = ", ".join(sorted(set(_FIELDS)))
            raise InvalidRequest(f"{str(name)[:40]!r}: not a field of a crawl request (known: {known})")
        attribute, kind = _FIELDS[name]
        if name == "run_id":
            continue
        if kind == "urls":
            values[attribute] = values.get(attribute, ()) + _urls(name, value)
        elif value is not None or kind == "count":
            values[attribute] = _value(name, kind, value)
    return CrawlRequest(
        run_id=_run_id("run_id", run_id), request_id=request_id, requested_at=requested_at, **values
    )


def _urls(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(url, str) for url in value):
        raise InvalidRequest(f"{name}: expected a list of URLs")
    return tuple(value)


def _value(name: str, kind: str, value: object) -> Any:
    """A field other than URLs, checked by its kind (null taken as absent before, where allowed)."""
    if kind in ("count", "count or null"):
        return _count(name, value)
    if kind == "scope":
        if value not in DISCOVERY_SCOPES:
            raise InvalidRequest(f"{name}: expected one of {', '.join(DISCOVERY_SCOPES)}")
        return value
    if kind == "patterns":
        return _patterns(name, value)
    return _run_id(name, value)


def _count(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise InvalidRequest(f"{name}: expected a whole number from 0 to {MAX_COUNT}")
    return value


def _patterns(name: str, value: object) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or len(value) > MAX_PATTERNS
        or not all(isinstance(p, str) and len(p) <= MAX_PATTERN_CHARS for p in value)
    ):
        raise InvalidRequest(f"{name}: expected up to {MAX_PATTERNS} regular expressions")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidRequest(f"{name} {pattern[:80]!r}: not a regular expression ({exc})") from None
    return tuple(value)


def _run_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not RUN_ID_PATTERN.fullmatch(value):
        shown = (
            repr(value[:80]) + ("..." if len(value) > 80 else "")
            if isinstance(value, str)
            else type(value).__name__
        )
        raise InvalidRequest(f"{name}: use up to 64 letters, digits, '.', '-' or '_', got {shown}")
    return value


def check(request: CrawlRequest, check_url: UrlCheck) -> None:
    """Raise InvalidRequest unless the request has a URL and every URL can be crawled: it
    canonicalises and `check_url` (the address guard) lets it through."""
    urls = request.all_urls()
    if not urls:
        raise InvalidRequest("no URL: give at least one of sitemaps, urls, site or start_urls")
    for where, url in urls:
        shown = url[:200] + ("..." if len(url) > 200 else "")
        try:
            check_url(canonicalize(url))
        except InvalidURL as exc:
            raise InvalidRequest(f"{where} {shown!r}: {exc.detail}") from None
        except BlockedAddress as exc:
            raise InvalidRequest(f"{where} {shown!r}: blocked address: {exc.detail}") from None
