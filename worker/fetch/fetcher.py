"""Fetch one URL over HTTP(S) with requests, following redirects ourselves.

Redirects are followed here rather than by requests so that every hop passes through
`check_url` (the place for an SSRF guard) and counts against one overall deadline. The deadline
(`FETCH_DEADLINE_S`) covers connecting, the headers and the body: the guarded session's
connections wait on no socket past it (shared/http/deadline.py), so a server dripping its headers
ends as a `timeout` like one dripping its body.
requests and urllib3 errors are translated into TransientError / PermanentError in
`_translate_errors` and nowhere else. Each hop's status line and headers are judged by
worker/fetch/verdicts.py (429 and 503 become Throttled, carrying Retry-After for the domain's pause).

A request may go through a proxy (`proxy=` URL). Failures that are the proxy's fault (cannot
connect to it, 407) raise ProxyFailed, so the caller can count them against that proxy. Proxies
come from the caller only: the session ignores HTTP_PROXY and friends in the environment.
`Fetcher.request` takes the status judgement as an argument (robots.txt is judged differently).

A Fetcher holds one pooled requests.Session, which the threads of a worker share.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import io
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import requests
import requests.exceptions
import urllib3.exceptions

from shared.errors import PermanentError, TransientError
from shared.http.deadline import fetch_deadline
from shared.http.proxies import ProxyFailed, socks_proxy_at_fault, without_credentials
from shared.settings import Settings
from worker.fetch.raw_body import exchange_of, read_raw_body
from worker.fetch.response import Response
from worker.fetch.verdicts import Judge, Verdict, judge_page
from worker.parse.budget import ParseBudget, ParseLimitExceeded
from worker.parse.markup_scan import MarkupScan

log = logging.getLogger("worker.fetch")  # the name operators know: kept as the module moved

_READ_CHUNK_BYTES = 64 * 1024

UrlCheck = Callable[[str], None]
"""Called with every URL before it is requested (the first and each redirect hop);
raises a TaskError to refuse it."""


def allow_any_url(url: str) -> None:
    """The default UrlCheck: refuses nothing."""


@dataclass(frozen=True)
class Validators:
    """Cache validators from an earlier response, sent back as a conditional request."""

    etag: str | None = None
    last_modified: str | None = None

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.etag:
            headers["If-None-Match"] = self.etag
        if self.last_modified:
            headers["If-Modified-Since"] = self.last_modified
        return headers


def _connection_failure(
    url: str, exc: requests.exceptions.ConnectionError, via_proxy: bool
) -> TransientError:
    """The proxy's failure (ProxyFailed) or the site's: an HTTP proxy's error, a timed-out
    connection to a proxy (the one connection made), or a SOCKS proxy unreachable or refusing
    our login are the proxy's."""
    if isinstance(exc, requests.exceptions.ProxyError) or (
        via_proxy and (isinstance(exc, requests.exceptions.ConnectTimeout) or socks_proxy_at_fault(exc))
    ):
        return ProxyFailed("proxy_error", without_credentials(f"{url}: {exc}"))
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return TransientError("timeout", f"{url}: {exc}")
    return TransientError("connection_error", f"{url}: {exc}")


@contextlib.contextmanager
def _translate_errors(url: str, via_proxy: bool = False) -> Iterator[None]:
    """The one place where requests' and urllib3's exceptions become ours."""
    try:
        yield
    except requests.exceptions.ConnectionError as exc:  # ProxyError and ConnectTimeout among them
        raise _connection_failure(url, exc, via_proxy) from None
    except requests.exceptions.Timeout as exc:  # a read timeout (ConnectTimeout is taken above)
        raise TransientError("timeout", f"{url}: {exc}") from None
    except (
        requests.exceptions.InvalidURL,
        requests.exceptions.MissingSchema,
        requests.exceptions.InvalidSchema,
        requests.exceptions.URLRequired,
        urllib3.exceptions.LocationValueError,
    ) as exc:
        raise PermanentError("invalid_url", f"{url}: {exc}") from None
    except requests.exceptions.ContentDecodingError as exc:
        raise PermanentError("bad_content_encoding", f"{url}: {exc}") from None
    except requests.exceptions.ChunkedEncodingError as exc:
        raise TransientError("connection_error", f"{url}: {exc}") from None
    except requests.exceptions.RequestException as exc:
        raise TransientError("request_error", f"{url}: {exc}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise _from_urllib3(url, exc) from None


def _from_urllib3(url: str, exc: urllib3.exceptions.HTTPError) -> TransientError | PermanentError:
    # The body is read from urllib3 directly (see _read_body), so its errors arrive raw.
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return TransientError("timeout", f"{url}: {exc}")
    if isinstance(exc, urllib3.exceptions.DecodeError):
        return PermanentError("bad_content_encoding", f"{url}: {exc}")
    return TransientError("connection_error", f"{url}: {exc}")


def _require_http_url(url: str) -> None:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise PermanentError("invalid_url", f"{url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PermanentError("invalid_url", f"{url!r}: not an http(s) URL with a host")


def _remaining_s(deadline: float, url: str) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TransientError("timeout", f"{url}: fetch deadline passed")
    return remaining


def _read_body(
    response: requests.Response,
    max_bytes: int,
    deadline: float,
    url: str,
    truncate: bool = False,
    budget: ParseBudget | None = None,
) -> bytes:
    """The decoded body, refused past `max_bytes` (after decompression) or past the deadline;
    with `truncate`, cut at `max_bytes` instead of refused. With a parse `budget`, a body that
    cannot fit it (worker/parse/markup_scan.py) is refused as `parse_limit` as soon as that shows,
    before it is all read."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes and not truncate:
        raise PermanentError("too_large", f"Content-Length {declared} > {max_bytes}")
    # A BytesIO grows one buffer in place and hands that same buffer out at the end: a list of
    # chunks joined at the end held every body twice over for a moment, and a worker holds the
    # bodies of all its fetches in flight.
    body = io.BytesIO()
    size = 0
    scan = MarkupScan(budget) if budget is not None else None
    while True:
        _remaining_s(deadline, url)
        # read1 returns whatever one socket read brings; read() would wait for a full chunk,
        # so a server dripping a byte at a time could hold us far past the deadline.
        chunk = response.raw.read1(_READ_CHUNK_BYTES, decode_content=True)
        if not chunk:
            return body.getvalue()
        size += len(chunk)
        if size > max_bytes:
            if truncate:
                body.write(chunk[: len(chunk) - (size - max_bytes)])
                return body.getvalue()
            raise PermanentError("too_large", f"body over {max_bytes} bytes")
        if scan is not None:
            try:
                scan.feed(chunk)  # about a millisecond per megabyte
            except ParseLimitExceeded as exc:
                raise PermanentError("parse_limit", f"{url}: {exc} in its first {size} bytes") from None
        body.write(chunk)


class Fetcher:
    """Fetches URLs through one pooled session, which the threads of a worker share."""

    def __init__(
        self,
        settings: Settings,
        session_factory: Callable[[], requests.Session] = requests.Session,
        check_url: UrlCheck = allow_any_url,
    ) -> None:
        self._settings = settings
        # A page that cannot fit the parse budget (worker/parse/html_builder.py) is refused while it
        # arrives, so that it holds neither the memory of its whole body nor a parse.
        self._parse_budget = ParseBudget(settings.parse_max_nodes)
        self._check_url = check_url
        # With WARC on, a page's body is read as it came and decoded here, for its record.
        self._keep_raw = bool(settings.warc_dir)
        self._session = session_factory()
        self._session.headers["User-Agent"] = settings.user_agent
        # Proxies are chosen per request from PROXIES; a stray HTTP_PROXY in the environment
        # must not route traffic elsewhere.
        self._session.trust_env = False
        # One session serves every site for the worker's whole life: a cookie jar would grow
        # without bound and carry state from one unrelated fetch into the next.
        self._session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def fetch(self, url: str, validators: Validators | None = None, proxy: str | None = None) -> Response:
        """GET `url`, following up to max_redirects redirects; raise a TaskError on failure."""
        # The validators belong to the resource at the end of the chain; sending them on
        # every hop is harmless, since redirect responses do not answer conditionals.
        headers = validators.headers() if validators else {}
        return self.request(
            url,
            headers,
            proxy,
            judge_page,
            self._settings.max_body_bytes,
            budget=self._parse_budget,
            keep_raw=self._keep_raw,
        )

    def request(
        self,
        url: str,
        headers: dict[str, str],
        proxy: str | None,
        judge: Judge,
        max_bytes: int,
        truncate: bool = False,
        budget: ParseBudget | None = None,
        keep_raw: bool = False,
    ) -> Response:
        """GET `url` as `judge` decides; a body is read only with a 2xx judged OK. With
        `keep_raw`, the Response carries the exchange as it went, for its WARC records."""
        started = time.monotonic()
        deadline = started + self._settings.fetch_deadline_s
        with fetch_deadline(deadline):  # every hop's connect and reads, headers included
            return self._request(
                url, headers, proxy, judge, max_bytes, truncate, budget, started, deadline, keep_raw
            )

    def _request(
        self,
        url: str,
        headers: dict[str, str],
        proxy: str | None,
        judge: Judge,
        max_bytes: int,
        truncate: bool,
        budget: ParseBudget | None,
        started: float,
        deadline: float,
        keep_raw: bool = False,
    ) -> Response:
        current = url
        visited = {url}
        for _hop in range(self._settings.max_redirects + 1):
            _require_http_url(current)
            self._check_url(current)
            sent_at = time.time()
            with (
                _translate_errors(current, via_proxy=proxy is not None),
                self._get(current, headers, proxy, deadline) as response,
            ):
                if proxy is not None and response.status_code == 407:
                    raise ProxyFailed("proxy_error", "407 Proxy Authentication Required", 407)
                verdict = judge(response, bool(headers))
                location = response.headers.get("Location")
                if verdict is not Verdict.REDIRECT:
                    body = raw = b""
                    if verdict is Verdict.OK and 200 <= response.status_code < 300:
                        if keep_raw:
                            body, raw = read_raw_body(
                                response, max_bytes, lambda: _remaining_s(deadline, url), url, budget
                            )
                        else:
                            body = _read_body(response, max_bytes, deadline, url, truncate, budget)
                    return Response(
                        final_url=current,
                        status=response.status_code,
                        content_type=response.headers.get("Content-Type"),
                        body=body,
                        etag=response.headers.get("ETag"),
                        last_modified=response.headers.get("Last-Modified"),
                        robots_tag=response.headers.get("X-Robots-Tag"),
                        fetch_ms=round((time.monotonic() - started) * 1000),
                        not_modified=verdict is Verdict.NOT_MODIFIED,
                        exchange=exchange_of(current, response, raw, sent_at) if keep_raw else None,
                    )
            current = self._next_hop(current, location or "", visited)
        raise PermanentError("redirect_loop", f"{url}: more than {self._settings.max_redirects} redirects")

    def _get(
        self, url: str, headers: dict[str, str], proxy: str | None, deadline: float
    ) -> requests.Response:
        remaining = _remaining_s(deadline, url)
        timeout = (
            min(self._settings.fetch_connect_timeout_s, remaining),
            min(self._settings.fetch_read_timeout_s, remaining),
        )
        # Prepared here rather than by Session.request, which merges the session's cookies,
        # auth, hooks and environment into every request: none apply to ours (no cookies are
        # kept, trust_env is off), and the merging cost nearly a third of a fetch's CPU.
        prepared = requests.PreparedRequest()
        prepared.prepare(method="GET", url=url, headers={**self._session.headers, **headers})
        return self._session.send(
            prepared,
            timeout=timeout,
            allow_redirects=False,
            stream=True,
            proxies={"http": proxy, "https": proxy} if proxy else {},
        )

    @staticmethod
    def _next_hop(current: str, location: str, visited: set[str]) -> str:
        try:
            target = urljoin(current, location.strip())
        except ValueError as exc:
            raise PermanentError("bad_redirect", f"{current} -> {location!r}: {exc}") from None
        if urlsplit(target).scheme not in ("http", "https"):
            raise PermanentError("bad_redirect", f"{current} -> {location!r}: not http(s)")
        if target in visited:
            raise PermanentError("redirect_loop", f"{current} -> {target} was visited already")
        visited.add(target)
        log.debug("redirect %s -> %s", current, target)
        return target
