"""python -m ops.run_report: a run's accounting where its services run elsewhere (compose)."""

from __future__ import annotations

import io

import pytest

from ops.accounting import Accounting
from ops.run_report import render, report
from shared.errors import ConfigError
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings


def test_render_reads_like_make_demo() -> None:
    done = Accounting(run_id="r", stored=2, dead_by_reason={"http_404": 1}, skips_by_reason={"robots": 1})
    text = render(done, {"enqueued.bulk": 3, "enqueued.priority": 1, "duplicates": 2, "invalid": 1})
    assert "run r\n" in text
    assert "  enqueued               4   {'bulk': 3, 'priority': 1}" in text
    assert "  duplicates             2   (not enqueued)" in text
    assert "  dead letters           1   (http_404 1)" in text
    assert "  skipped                1   (robots 1)" in text
    assert "  accounted for          4 of 4: ok" in text


def test_render_says_how_many_copies_the_broker_got_after_a_takeover() -> None:
    done = Accounting(run_id="r", stored=4)
    counters = {"enqueued.bulk": 4, "taken_over": 3, "republished": 2, "copies_received": 6}
    counters |= {"duplicate_deliveries.copy": 1}
    text = render(done, counters)
    assert "  taken over             3   claims of a dead producer; 2 re-published" in text
    assert (
        "  broker copies          6   delivered so far: 4 first + 2 second copies "
        "(1 acked unfetched, 1 handled again)" in text
    )


def test_a_run_still_crawling_is_reported_waiting_with_exit_1(settings: Settings) -> None:
    client = connect_redis(settings, OPERATOR)
    try:
        client.hset(
            Keys(settings.redis_prefix).run_stats("r-1"), mapping={"enqueued.bulk": 2, "duplicates": 1}
        )
    finally:
        client.close()
    db.ensure_schema(settings)
    out = io.StringIO()

    assert report(settings, "r-1", 0.0, out) == 1
    assert "accounted for          0 of 2: waiting" in out.getvalue()


def test_an_unknown_run_is_one_line(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="--run nothing-here: no such run"):
        report(settings, "nothing-here", 0.0, io.StringIO())
