"""Progress figures and lines: rate, ETA, durations, the plain lines a log gets."""

from __future__ import annotations

import io

from producer.pipeline_types import Counts
from producer.progress import describe
from shared.progress import ProgressDisplay, Rate, Snapshot, duration, eta_s, live_detail, periodic_line
from tests.fakes import FakeTime


def snap(at: float, stored: int, total: int = 300, dead: int = 0, skipped: int = 0, **kw: object) -> Snapshot:
    return Snapshot(at, total, stored, dead, skipped, **kw)  # type: ignore[arg-type]


def test_rate_is_the_average_over_the_window() -> None:
    rate = Rate(window_s=10)
    assert rate.add(snap(0, 0)) == 0.0  # one point: no rate yet
    assert rate.add(snap(5, 50)) == 10.0
    assert rate.add(snap(10, 150)) == 15.0  # 150 in 10 s
    # Points older than the window drop out: 10 s from t=10 to t=20, 100 more.
    assert rate.add(snap(20, 250)) == 10.0


def test_rate_counts_dead_letters_and_skips_as_done() -> None:
    rate = Rate()
    rate.add(snap(0, 0))
    assert rate.add(snap(2, 4, dead=2, skipped=2)) == 4.0


def test_eta_is_what_is_left_over_the_rate() -> None:
    assert eta_s(snap(0, 100, total=300), 20.0) == 10.0
    assert eta_s(snap(0, 100, total=300), 0.0) is None  # nothing moving: unknown, not infinite
    assert eta_s(snap(0, 300, total=300), 0.0) == 0.0  # done
    assert eta_s(snap(0, 0, total=0, producing=True), 0.0) is None  # nothing enqueued yet


def test_durations_read_like_a_clock() -> None:
    assert [duration(s) for s in (None, 0, 44.6, 65, 3599, 3600, 7440)] == [
        "--",
        "0s",
        "45s",
        "1m05s",
        "59m59s",
        "1h00m",
        "2h04m",
    ]


def test_the_plain_line_says_stored_rate_dead_done_queued_and_eta() -> None:
    line = periodic_line(snap(0, 120, total=300, dead=3, queued=177), 10.0)
    assert line == (
        "stored 120 (600 pages/min), dead 3, skipped 0; 123 of 300 done (41%), 177 queued, ETA 18s"
    )


def test_while_enqueuing_the_eta_is_a_lower_bound() -> None:
    line = periodic_line(snap(0, 10, total=100, producing=True), 9.0)
    assert "still enqueuing" in line and line.endswith("ETA >10s")
    assert "(enqueuing)" in live_detail(snap(0, 10, total=100, producing=True), 9.0)


def test_an_unknown_queue_depth_shows_as_a_question_mark() -> None:
    assert "queued ?" in live_detail(snap(0, 1), 1.0)


def test_off_a_terminal_a_line_is_printed_at_most_every_interval() -> None:
    out = io.StringIO()
    clock = FakeTime()
    with ProgressDisplay(out, "run", every_s=10, clock=clock) as display:
        assert not display.live  # a StringIO is no terminal
        for second in range(35):
            clock.now = float(second)
            display.show(second, 100, "detail", f"line at {second}")
        display.note("a note")
    assert out.getvalue().splitlines() == [
        "  ... line at 10",
        "  ... line at 20",
        "  ... line at 30",
        "a note",
    ]


def test_on_a_terminal_the_line_is_drawn_in_place_and_notes_go_above_it() -> None:
    out = io.StringIO()
    with ProgressDisplay(out, "run-x", live=True) as display:
        display.show(5, 10, "2.0 pages/s", "unused")
        display.note("worker-1 started again")
    text = out.getvalue()
    assert "worker-1 started again" in text
    assert "run-x" in text and "5/10" in text and "2.0 pages/s" in text
    assert "unused" not in text


def test_the_producer_line_counts_up_without_a_total() -> None:
    counts = Counts(urls_seen=4000, duplicates=90)
    counts.enqueued.update(priority=100, bulk=3800)
    counts.invalid["bad scheme"] = 10
    assert describe(counts, 3, 812.4) == (
        "4,000 URLs read (812/s), 3,900 enqueued, 90 duplicates, 10 invalid, 3 sitemaps"
    )


def test_the_producer_line_says_how_many_of_the_enqueued_followed_a_takeover() -> None:
    counts = Counts(urls_seen=10, taken_over=4, republished=3)
    counts.enqueued.update(bulk=10)
    assert describe(counts, 1, 5.0).endswith(
        ", 4 claims taken over (3 of the enqueued re-published: the broker may hold an earlier copy of each)"
    )
