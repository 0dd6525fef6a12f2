"""ops.copies: what the broker got from a run's producers, from the run's counters."""

from __future__ import annotations

from ops.copies import Copies

AFTER_KILLS = {
    "enqueued.bulk": 900,
    "enqueued.priority": 100,
    "taken_over": 400,
    "republished": 250,
    "copies_received": 1_200,
    "copies_redelivered": 0,
    "duplicate_deliveries": 197,
    "duplicate_deliveries.copy": 190,
    "duplicate_deliveries.forwarded": 7,  # came back from a defer queue to a settled URL
    "retries": 5,
}


def test_second_copies_are_what_was_delivered_beyond_the_first_copies() -> None:
    copies = Copies.from_counters(AFTER_KILLS)
    assert (copies.first, copies.delivered, copies.second) == (1_000, 1_200, 200)
    assert (copies.second_acked, copies.second_handled_again) == (197, 3)
    assert copies.figures()["second"] == 200


def test_the_lines_say_first_plus_second_and_the_takeovers() -> None:
    taken, delivered = Copies.from_counters(AFTER_KILLS).lines()
    assert "400" in taken and "250 re-published" in taken
    assert "1200" in delivered and "1000 first + 200 second copies" in delivered
    assert "197 acked unfetched, 3 handled again" in delivered
    assert "redelivered" not in delivered


def test_redelivered_copies_make_the_figure_a_bound() -> None:
    (line,) = Copies.from_counters(
        {"enqueued.bulk": 10, "copies_received": 8, "copies_redelivered": 2}
    ).lines()
    assert "+ up to 2 redelivered uncounted" in line
    assert "8 first + 0 second copies" in line  # not drained yet: no second copy inferred


def test_a_run_with_no_deliveries_and_no_takeovers_adds_no_line() -> None:
    assert Copies.from_counters({"enqueued.bulk": 10, "state": "paused"}).lines() == []
