"""Fetching sitemaps and robots.txt over HTTP: the producer's only use of requests.

The sitemap reader sees only `Fetch` (URL in, bytes out), so its tests pass a dictionary
lookup instead of a network. Every requests and urllib3 error becomes FetchFailed here.

Sitemap hosts are strangers too: connections go through the address guard (shared/http/netguard.py),
so a sitemap or robots.txt on a blocked address (or a redirect to one) fails with reason
`blocked_address`. Bodies are capped on DECOMPRESSED bytes: we ask for identity, but a server
that sends Content-Encoding anyway is decoded here, in bounded pieces, against the cap.

With PROXIES set, every sitemap and robots.txt request goes through the workers' proxy pool
(shared/http/proxies.py): the same proxies, the same rotation, the same bench in Redis. A proxy that
fails is counted against it and the request goes once through another; when no proxy is usable
the file fails (`sitemaps_failed` in the summary) and a re-run with the same run id reads it.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterator

import requests
import urllib3.exceptions

from shared.errors import PipelineError, TaskError
from shared.http.deadline import fetch_deadline
from shared.http.netguard import guarded_session
from shared.http.proxies import Proxy, ProxyFailed, ProxyPool, without_credentials
from shared.settings import Settings
from shared.try_later import TryLater

log = logging.getLogger(__name__)

# Sitemaps run to 50 MB, far bigger than pages: allow them more time than one page fetch.
SITEMAP_DEADLINE_FACTOR = 4
CHUNK_BYTES = 64 * 1024
MAX_CONTENT_CODINGS = 2  # gzip over gzip is as far as honest servers go
_ZLIB_ANY_HEADER = 32 + zlib.MAX_WBITS  # a gzip or a zlib header, whichever the data has


class FetchFailed(PipelineError):
    """A sitemap or robots.txt could not be had; `str()` is a one-line reason."""

    def __init__(self, reason: str, http_status: int | None = None) -> None:
        super().__init__(reason)
        self.http_status = http_status


Fetch = Callable[[str], bytes]
"""Return the body at a URL (as sent: possibly gzip) or raise FetchFailed."""


class HttpFetcher:
    """`Fetch` over requests: one session, the settings' timeouts and User-Agent, and a cap on
    the body read so a huge or endless response cannot fill memory."""

    def __init__(
        self,
        settings: Settings,
        session_factory: Callable[[Settings], requests.Session] = guarded_session,
        proxies: ProxyPool | None = None,
    ) -> None:
        self._proxies = proxies
        self._timeout = (settings.fetch_connect_timeout_s, settings.fetch_read_timeout_s)
        self._deadline_s = settings.fetch_deadline_s * SITEMAP_DEADLINE_FACTOR
        self._max_bytes = settings.max_sitemap_bytes
        self._session = session_factory(settings)
        self._session.max_redirects = settings.max_redirects
        self._session.headers["User-Agent"] = settings.user_agent
        # Ask for identity so the byte cap counts what the server sends, and a gzip file
        # stays recognisable by its magic bytes.
        self._session.headers["Accept-Encoding"] = "identity"

    def __call__(self, url: str) -> bytes:
        if self._proxies is None:
            return self._get(url, None)
        tried: list[Proxy] = []
        while True:
            try:
                proxy = self._proxies.choose(avoid=tried)
            except TryLater as later:
                raise FetchFailed(f"every proxy is benched (for {later.wait_s:.0f} s more)") from None
            try:
                return self._get(url, proxy)
            except ProxyFailed as exc:
                # The proxy's fault, not the site's: counted against it, then one other proxy
                # gets a try, as a worker's request does.
                self._proxies.failed(proxy, exc)
                tried.append(proxy)
                if len(tried) >= min(2, self._proxies.size):
                    raise FetchFailed(f"proxy {proxy.label} failed ({exc.reason})") from None

    def _get(self, url: str, proxy: Proxy | None) -> bytes:
        started = time.monotonic()
        via = {"http": proxy.url, "https": proxy.url} if proxy is not None else None
        try:
            # The deadline bounds every connect and socket read of the guarded session, the
            # headers' included, on every redirect hop (shared/http/deadline.py).
            with (
                fetch_deadline(started + self._deadline_s),
                self._session.get(url, timeout=self._timeout, stream=True, proxies=via) as response,
            ):
                if proxy is not None and response.status_code == 407:
                    raise ProxyFailed("proxy_error", "407 Proxy Authentication Required", 407)
                if response.status_code != 200:
                    raise FetchFailed(f"HTTP {response.status_code}", response.status_code)
                return self._read_capped(response, started)
        except ProxyFailed:
            raise
        except TaskError as exc:  # the guard's BlockedAddress or InvalidURL, here or on a redirect
            raise FetchFailed(str(exc)) from None
        except requests.exceptions.ProxyError as exc:  # before RequestException, its base
            raise ProxyFailed("proxy_error", without_credentials(str(exc))) from None
        except requests.exceptions.ConnectTimeout as exc:
            if proxy is not None:  # the connection that timed out was the one to the proxy
                raise ProxyFailed("proxy_error", without_credentials(str(exc))) from None
            raise FetchFailed(_describe(exc)) from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            if time.monotonic() - started >= self._deadline_s:
                raise FetchFailed(f"took longer than {self._deadline_s:.0f} s") from None
            raise FetchFailed(without_credentials(_describe(exc))) from None

    def _read_capped(self, response: requests.Response, started: float) -> bytes:
        encoding = response.headers.get("Content-Encoding", "")
        declared = response.headers.get("Content-Length", "")
        if not encoding and declared.isdigit() and int(declared) > self._max_bytes:
            raise FetchFailed(f"larger than {self._max_bytes} bytes (Content-Length {declared})")
        decoder = CappedDecoder(encoding)
        body = bytearray()
        while True:
            if time.monotonic() - started > self._deadline_s:
                raise FetchFailed(f"took longer than {self._deadline_s:.0f} s")
            # read1 returns what one socket read brings, so a server dripping a byte at a time
            # meets the deadline. Raw bytes: decoding is ours, in pieces counted against the
            # cap, whichever urllib3 is installed.
            raw = response.raw.read1(CHUNK_BYTES, decode_content=False)
            for piece in decoder.decode(raw):
                body += piece
                if len(body) > self._max_bytes:
                    raise FetchFailed(f"larger than {self._max_bytes} bytes")
            if not raw:
                return bytes(body)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> HttpFetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class CappedDecoder:
    """Undoes a Content-Encoding (gzip, x-gzip, deflate; several layers) in pieces of at most
    CHUNK_BYTES, so a bomb costs bounded memory and is cut as soon as the caller's cap is met."""

    def __init__(self, content_encoding: str) -> None:
        codings = [c.strip().lower() for c in content_encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        unknown = [c for c in codings if c not in ("gzip", "x-gzip", "deflate")]
        if unknown:
            raise FetchFailed(f"unsupported Content-Encoding {unknown[0][:40]!r}")
        if len(codings) > MAX_CONTENT_CODINGS:
            raise FetchFailed(f"more than {MAX_CONTENT_CODINGS} Content-Encoding layers")
        self._layers = [zlib.decompressobj(_ZLIB_ANY_HEADER) for _ in codings]

    def decode(self, data: bytes) -> Iterator[bytes]:
        return self._through(data, 0)

    def _through(self, data: bytes, layer: int) -> Iterator[bytes]:
        # Layers are listed in the order they were applied; the order of undoing them is the
        # reverse, but as all are zlib streams the same decompressor fits each.
        if layer == len(self._layers):
            if data:
                yield data
            return
        decompressor = self._layers[layer]
        while data:
            try:
                piece = decompressor.decompress(data, CHUNK_BYTES)
            except zlib.error:
                raise FetchFailed("bad compressed data (Content-Encoding)") from None
            data = decompressor.unconsumed_tail
            yield from self._through(piece, layer + 1)


def _describe(exc: requests.RequestException | urllib3.exceptions.HTTPError) -> str:
    if isinstance(exc, (requests.Timeout, urllib3.exceptions.TimeoutError)):
        return "timed out"
    if isinstance(exc, requests.TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, (requests.ConnectionError, urllib3.exceptions.ProtocolError)):
        return "connection failed"
    first_line = (str(exc) or exc.__class__.__name__).splitlines()[0]
    return f"{exc.__class__.__name__}: {first_line[:200]}"
