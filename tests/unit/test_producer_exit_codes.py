from __future__ import annotations

from typing import Any

import pytest

from producer.__main__ import (
    EXIT_INTERRUPTED,
    EXIT_NOTHING_READ,
    EXIT_PUBLISH_FAILED,
    EXIT_TERMINATED,
    exit_code,
    parse_args,
    seeded_to_the_end,
)

FAILED = [{"url": "http://s/gone.xml", "error": "HTTP 404"}]


def summary(
    urls_seen: int,
    failed: list[dict[str, str]],
    publish_failed: int = 0,
    interrupted: bool = False,
    stop_signal: str | None = None,
    stopped_early: bool = False,
    left_claimed: int = 0,
) -> dict[str, Any]:
    return {
        "run_id": "r",
        "urls_seen": urls_seen,
        "sitemaps_failed": failed,
        "publish_failed": publish_failed,
        "interrupted": interrupted or stop_signal is not None,
        "stop_signal": stop_signal,
        "stopped_early": stopped_early or stop_signal is not None,
        "left_claimed": left_claimed,
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
        (summary(10, [], stop_signal="SIGINT"), False, EXIT_INTERRUPTED),
        (summary(10, [], stop_signal="SIGTERM"), False, EXIT_TERMINATED),  # docker stop, eviction
        (summary(10, [], stop_signal="SIGTERM", publish_failed=1), False, EXIT_PUBLISH_FAILED),
        (summary(10, [], stopped_early=True), False, EXIT_INTERRUPTED),  # unread input: never 0
        (summary(10, [], left_claimed=4), False, EXIT_INTERRUPTED),  # unsettled URLs: never 0
    ],
)
def test_exit_code(result: dict[str, Any], strict: bool, code: int) -> None:
    assert exit_code(result, strict) == code


def test_strict_is_off_unless_asked() -> None:
    assert parse_args(["--sitemap", "http://s/a.xml"]).strict is False
    assert parse_args(["--sitemap", "http://s/a.xml", "--strict"]).strict is True


@pytest.mark.parametrize(
    ("result", "seeded"),
    [
        (summary(10, []), True),
        (summary(10, FAILED), False),  # the next --once start reads the failed sitemap again
        (summary(10, [], left_claimed=2), False),
        (summary(10, [], stop_signal="SIGTERM"), False),
    ],
)
def test_only_a_run_read_and_settled_to_the_end_is_marked_seeded(
    result: dict[str, Any], seeded: bool
) -> None:
    assert seeded_to_the_end(result, exit_code(result)) is seeded
