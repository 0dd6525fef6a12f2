"""Fetching sitemaps and robots.txt over HTTP: the producer's only use of requests.

The sitemap reader sees only `Fetch` (URL in, bytes out), so its tests pass a dictionary
lookup instead of a network. Every requests error becomes FetchFailed here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import requests

from shared.settings import Settings

log = logging.getLogger(__name__)

# Sitemaps run to 50 MB, far bigger than pages: allow them more time than one page fetch.
SITEMAP_DEADLINE_FACTOR = 4
CHUNK_BYTES = 64 * 1024


class FetchFailed(Exception):
    """A sitemap or robots.txt could not be had; `str()` is a one-line reason."""

    def __init__(self, reason: str, http_status: int | None = None) -> None:
        super().__init__(reason)
        self.http_status = http_status


Fetch = Callable[[str], bytes]
"""Return the body at a URL (as sent: possibly gzip) or raise FetchFailed."""


class HttpFetcher:
    """`Fetch` over requests: one session, the settings' timeouts and User-Agent, and a cap on
    the body read so a huge or endless response cannot fill memory."""

    def __init__(self, settings: Settings) -> None:
        self._timeout = (settings.fetch_connect_timeout_s, settings.fetch_read_timeout_s)
        self._deadline_s = settings.fetch_deadline_s * SITEMAP_DEADLINE_FACTOR
        self._max_bytes = settings.max_sitemap_bytes
        self._session = requests.Session()
        self._session.max_redirects = settings.max_redirects
        self._session.headers["User-Agent"] = settings.user_agent
        # Ask for identity so the byte cap counts what the server sends, and a gzip file
        # stays recognisable by its magic bytes.
        self._session.headers["Accept-Encoding"] = "identity"

    def __call__(self, url: str) -> bytes:
        started = time.monotonic()
        try:
            with self._session.get(url, timeout=self._timeout, stream=True) as response:
                if response.status_code != 200:
                    raise FetchFailed(f"HTTP {response.status_code}", response.status_code)
                return self._read_capped(response, started)
        except requests.RequestException as exc:
            raise FetchFailed(_describe(exc)) from None

    def _read_capped(self, response: requests.Response, started: float) -> bytes:
        body = bytearray()
        for chunk in response.iter_content(CHUNK_BYTES):
            body += chunk
            if len(body) > self._max_bytes:
                raise FetchFailed(f"larger than {self._max_bytes} bytes")
            if time.monotonic() - started > self._deadline_s:
                raise FetchFailed(f"took longer than {self._deadline_s:.0f} s")
        return bytes(body)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> HttpFetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _describe(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.Timeout):
        return "timed out"
    if isinstance(exc, requests.TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, requests.ConnectionError):
        return "connection failed"
    first_line = (str(exc) or exc.__class__.__name__).splitlines()[0]
    return f"{exc.__class__.__name__}: {first_line[:200]}"
