"""Dates a sitemap or feed gives for its URLs, as one form: UTC ISO 8601, or None.

Recrawl decisions and routing rules compare these values, so a task carries the date in one
form whatever the site wrote:

    '2024-05-01'                   -> '2024-05-01T00:00:00Z'
    '2024-05-01T12:30:00+02:00'    -> '2024-05-01T10:30:00Z'
    '2024-05'                      -> '2024-05-01T00:00:00Z'
    'Wed, 01 May 2024 10:00:00 GMT' (RSS)  -> '2024-05-01T10:00:00Z'
    'yesterday', '2024-02-30'      -> None (the caller counts a warning)

Sitemaps use W3C datetimes (a profile of ISO 8601): a year, a month, a day, or a day and a time
with a zone. A time without a zone is taken as UTC, a space instead of the 'T' is accepted (both
are common in the wild), and fractions of seconds are dropped.
"""

from __future__ import annotations

import datetime
import email.utils
import functools
import re

# Whatever a sitemap in the wild writes that is still a W3C datetime; ISO 8601's other forms
# (week dates, ordinal dates, '20240501') are not dates a sitemap gives.
W3C_DATETIME = re.compile(
    r"\d{4}(?:-\d{2}(?:-\d{2}(?:[Tt ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:[Zz]|[+-]\d{2}:?\d{2})?)?)?)?"
)
MAX_DATE_CHARS = 64
CACHED_DATES = 4096  # a sitemap repeats the same few dates across thousands of URLs


@functools.lru_cache(maxsize=CACHED_DATES)
def normalise_lastmod(text: str) -> str | None:
    """A sitemap <lastmod> (or an Atom <updated>) in UTC ISO 8601, None when it is no date."""
    text = text.strip()
    if len(text) > MAX_DATE_CHARS or not W3C_DATETIME.fullmatch(text):
        return None
    if len(text) == 4:
        text += "-01-01"
    elif len(text) == 7:
        text += "-01"
    try:
        parsed = datetime.datetime.fromisoformat(text.replace(",", "."))
    except ValueError:  # '2024-02-30', '2024-13-01', '25:00'
        return None
    return _utc(parsed)


@functools.lru_cache(maxsize=CACHED_DATES)
def normalise_rss_date(text: str) -> str | None:
    """An RSS <pubDate> (RFC 822: 'Wed, 01 May 2024 10:00:00 GMT') in UTC ISO 8601, else None.
    Feeds that write ISO 8601 instead are read as such."""
    text = text.strip()
    if len(text) > MAX_DATE_CHARS:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return normalise_lastmod(text)
    return _utc(parsed)


def _utc(moment: datetime.datetime) -> str | None:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    try:
        utc = moment.astimezone(datetime.UTC)
    except (OverflowError, ValueError):  # year 1 with a zone east of UTC, and the like
        return None
    return utc.replace(microsecond=0, tzinfo=None).isoformat() + "Z"
