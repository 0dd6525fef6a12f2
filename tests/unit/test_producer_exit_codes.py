from __future__ import annotations

from typing import Any

import pytest

from producer.__main__ import EXIT_INTERRUPTED, EXIT_NOTHING_READ, EXIT_PUBLISH_FAILED, exit_code, parse_args

pytestmark = pytest.mark.unit

FAILED = [{"url": "http://s/gone.xml", "error": "HTTP 404"}]


def summary(
    urls_seen: int, failed: list[dict[str, str]], publish_failed: int = 0, interrupted: bool = False
) -> dict[str, Any]:
    return {
        "run_id": "r",
        "urls_seen": urls_seen,
        "sitemaps_failed": failed,
        "publish_failed": publish_failed,
        "interrupted": interrupted,
    }


@pytest.mark.parametrize(
    ("result", "strict", "code"),
    [
        (summary(10, []), False, 0),
        (summary(10, []), True, 0),
        (summary(0, []), True, 0),  # a sitemap read that lists nothing is no failure
        (summary(10, FAILED), False, 0),  # what could be read is crawled
        (summary(10, FAILED), True, EXIT_NOTHING_READ),
        (summary(0, FAILED), False, EXIT_NOTHING_READ),  # no source could be read
        (summary(0, FAILED), True, EXIT_NOTHING_READ),
        (summary(10, FAILED, publish_failed=3), True, EXIT_PUBLISH_FAILED),
        (summary(10, FAILED, interrupted=True), True, EXIT_INTERRUPTED),
    ],
)
def test_exit_code(result: dict[str, Any], strict: bool, code: int) -> None:
    assert exit_code(result, strict) == code


def test_strict_is_off_unless_asked() -> None:
    assert parse_args(["--sitemap", "http://s/a.xml"]).strict is False
    assert parse_args(["--sitemap", "http://s/a.xml", "--strict"]).strict is True
