"""A run's progress read from committed figures is printed as ops.crawl prints it."""

from __future__ import annotations

from ops.run_progress import RunProgress, rate_per_s
from shared.progress import Snapshot, live_detail, periodic_line


def test_the_rate_is_taken_over_the_window_or_the_runs_age_when_younger() -> None:
    assert rate_per_s(60, age_s=600.0, window_s=30.0) == 2.0
    assert rate_per_s(20, age_s=10.0, window_s=30.0) == 2.0
    assert rate_per_s(3, age_s=0.01, window_s=30.0) == 3.0  # not 300/s for a first page
    assert rate_per_s(0, age_s=600.0, window_s=30.0) == 0.0
    assert rate_per_s(5, age_s=None, window_s=30.0) == 0.0


def test_lines_and_json_are_those_of_the_crawl_display() -> None:
    progress = RunProgress("r", enqueued=300, stored=120, dead=3, skipped=0, pages_per_s=10.0, producing=True)
    snapshot = Snapshot(0.0, 300, 120, 3, 0, None, True)
    assert progress.line() == periodic_line(snapshot, 10.0)
    assert progress.detail() == live_detail(snapshot, 10.0)
    assert progress.line().endswith("ETA >18s")
    assert progress.as_json() == {
        "run_id": "r",
        "enqueued": 300,
        "stored": 120,
        "dead": 3,
        "skipped": 0,
        "left": 177,
        "pages_per_s": 10.0,
        "eta_s": 17.7,
        "producing": True,
        "window_s": 30.0,
    }


def test_a_finished_run_has_nothing_left_and_no_eta_to_wait_for() -> None:
    done = RunProgress("r", enqueued=10, stored=8, dead=1, skipped=1, pages_per_s=0.0, producing=False)
    assert (done.left, done.eta_s) == (0, 0.0)
    stalled = RunProgress("r", enqueued=10, stored=5, dead=0, skipped=0, pages_per_s=0.0, producing=False)
    assert (stalled.left, stalled.eta_s) == (5, None)
