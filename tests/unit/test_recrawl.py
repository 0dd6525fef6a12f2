"""When a URL is due again on a recrawl."""

from __future__ import annotations

import datetime

import pytest

from producer.recrawl import is_due, parse_lastmod

UTC = datetime.UTC
FETCHED = datetime.datetime(2024, 5, 10, 12, 0, tzinfo=UTC)
NOW = datetime.datetime(2024, 5, 12, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("lastmod", "changefreq", "fetched_at", "due"),
    [
        (None, None, None, True),  # never fetched
        ("2024-05-11", None, FETCHED, True),  # changed after our fetch
        ("2024-05-09", None, FETCHED, False),  # unchanged since
        ("2024-05-10T12:00:00Z", None, FETCHED, False),  # exactly our fetch: not newer
        ("2024-05-10T13:00:00+01:00", None, FETCHED, False),  # same instant in another zone
        ("2024-05-09", "always", FETCHED, False),  # the lastmod wins over changefreq
        (None, "daily", FETCHED, True),  # two days old, daily
        (None, "weekly", FETCHED, False),
        (None, "never", FETCHED, False),
        (None, "Hourly ", FETCHED, True),
        (None, "sometimes", FETCHED, True),  # unknown word: nothing says unchanged
        ("yesterday", None, FETCHED, True),  # unreadable lastmod says nothing
    ],
)
def test_is_due(
    lastmod: str | None, changefreq: str | None, fetched_at: datetime.datetime | None, due: bool
) -> None:
    assert is_due(lastmod, changefreq, fetched_at, NOW) is due


def test_a_date_without_zone_is_taken_as_utc() -> None:
    assert parse_lastmod("2024-05-01") == datetime.datetime(2024, 5, 1, tzinfo=UTC)
    assert parse_lastmod("") is None
