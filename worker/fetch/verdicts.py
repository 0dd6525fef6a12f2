"""How the worker judges an HTTP answer by its status line and headers: a page to parse, a
304 for the cached copy, a redirect to follow, or the TaskError it deserves (429 and 503 as
Throttled, carrying Retry-After for the domain's shared pause). They read nothing but the answer
(and the clock, for a Retry-After date); worker/fetch/fetcher.py applies them to each hop, and
worker/politeness/robots.py judges robots.txt with `classify`.
"""

from __future__ import annotations

import email.utils
import enum
import time
from collections.abc import Callable

import requests

from shared.errors import PermanentError, TransientError

HTML_MEDIA_TYPES = frozenset({"text/html", "application/xhtml+xml"})


class Verdict(enum.Enum):
    OK = "ok"
    NOT_MODIFIED = "not_modified"
    REDIRECT = "redirect"


def media_type(content_type: str | None) -> str | None:
    """'text/html; charset=utf-8' -> 'text/html'."""
    if not content_type:
        return None
    return content_type.split(";", 1)[0].strip().lower() or None


def is_html(content_type: str | None) -> bool:
    return media_type(content_type) in HTML_MEDIA_TYPES


class Throttled(TransientError):
    """A 429 or 503 answer: the server is asking us to slow down (seconds from Retry-After)."""

    def __init__(self, reason: str, detail: str, http_status: int, retry_after_s: float | None) -> None:
        super().__init__(reason, detail, http_status)
        self.retry_after_s = retry_after_s


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date; None if absent
    or unreadable. A date in the past means 0."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a date without a zone is read as such
        return None
    return max(0.0, when.timestamp() - now)


def classify(
    status: int,
    *,
    content_type: str | None = None,
    location: str | None = None,
    retry_after: str | None = None,
    conditional: bool = False,
    now: float | None = None,
) -> Verdict:
    """Judge a response by its status line and headers; raise the TaskError it deserves.

    `conditional` says whether the request carried validators, which is what makes a 304 good.
    `now` (Unix time) reads a Retry-After given as a date; default: the clock.
    """
    if 200 <= status < 300:
        if not is_html(content_type):
            raise PermanentError("unsupported_content", f"Content-Type {content_type!r}", http_status=status)
        return Verdict.OK
    if status == 304:
        if conditional:
            return Verdict.NOT_MODIFIED
        # Without validators a 304 is a server bug and has no body to show.
        raise PermanentError("http_304", "not modified, but the request was not conditional", 304)
    if 300 <= status < 400:
        if not location or not location.strip():
            raise PermanentError("bad_redirect", f"{status} without Location", http_status=status)
        return Verdict.REDIRECT
    if status in (408, 429) or 500 <= status < 600:
        detail = f"Retry-After: {retry_after}" if retry_after else ""
        if status in (429, 503):
            delay_s = parse_retry_after(retry_after, time.time() if now is None else now)
            raise Throttled(f"http_{status}", detail, status, delay_s)
        raise TransientError(f"http_{status}", detail, http_status=status)
    raise PermanentError(f"http_{status}", http_status=status)


Judge = Callable[[requests.Response, bool], Verdict]
"""Judges a response (and whether the request was conditional): OK, NOT_MODIFIED or REDIRECT,
or raises the TaskError it deserves."""


def judge_page(response: requests.Response, conditional: bool) -> Verdict:
    return classify(
        response.status_code,
        content_type=response.headers.get("Content-Type"),
        location=response.headers.get("Location"),
        retry_after=response.headers.get("Retry-After"),
        conditional=conditional,
    )
