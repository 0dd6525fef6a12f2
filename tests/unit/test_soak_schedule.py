"""The soak's schedule (tests/soak/schedule.py): drawn from its seed alone, every kind of fault
on every target, faults on different targets overlapping, never two on one target."""

from __future__ import annotations

import pytest

from tests.soak.load import plan
from tests.soak.schedule import HOLD_S, KINDS, Fault, _collide, draw, every_pair, load, overlapping

WINDOW_S = 300.0  # the CI soak's five minutes


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    assert draw(46, WINDOW_S) == draw(46, WINDOW_S)
    assert draw(46, WINDOW_S) != draw(47, WINDOW_S)


@pytest.mark.parametrize("seed", range(1, 40))
def test_every_kind_strikes_every_target_within_the_window(seed: int) -> None:
    schedule = draw(seed, WINDOW_S)
    assert {(f.kind, f.target) for f in schedule} == set(every_pair())
    assert {f.kind for f in schedule} == set(KINDS)
    assert all(20.0 <= f.at_s < WINDOW_S for f in schedule)
    assert all(HOLD_S[f.kind][0] <= f.hold_s <= HOLD_S[f.kind][1] for f in schedule)
    assert all(20 <= f.delay_ms <= 400 for f in schedule if f.kind == "delay")


@pytest.mark.parametrize("seed", range(1, 40))
def test_faults_overlap_across_targets_and_never_on_one(seed: int) -> None:
    schedule = draw(seed, WINDOW_S)
    pairs = overlapping(schedule)
    assert len(pairs) >= 5, [(a.describe(), b.describe()) for a, b in pairs]
    assert any(a.target != b.target for a, b in pairs)
    clashes = [(a.describe(), b.describe()) for a, b in pairs if _collide(a, b)]
    assert clashes == []


def test_a_longer_window_draws_more_faults() -> None:
    assert len(draw(5, 1800.0)) > 2 * len(draw(5, WINDOW_S))


def test_a_printed_schedule_reads_back_as_it_was() -> None:
    schedule = draw(9, WINDOW_S)
    printed = "soak: faults\n" + "\n".join(f.to_json() for f in schedule)
    assert load(printed) == schedule


def test_overlapping_counts_an_instant_fault_inside_a_held_one() -> None:
    outage = Fault(10.0, "outage", "redis", 5.0)
    reset = Fault(12.0, "reset", "amqp", 0.0)
    later = Fault(16.0, "kill", "worker", 1.0)
    assert overlapping([later, reset, outage]) == [(outage, reset)]


def test_a_window_shorter_than_the_warm_up_is_refused() -> None:
    with pytest.raises(ValueError, match="no time after"):
        draw(1, 10.0)


@pytest.mark.parametrize(("urls", "window_s"), [(50_000, 1800.0), (50_000, 1080.0), (8_000, 300.0)])
def test_the_waves_hold_exactly_the_urls_asked_for(urls: int, window_s: float) -> None:
    waves = plan(46, urls, window_s)
    assert sum(w.graph_pages + len(w.shape.paths()) for w in waves) == urls
    assert all(w.at_s <= 0.8 * window_s for w in waves)
    assert len({w.sitemap_run for w in waves} | {w.discover_run for w in waves}) == 2 * len(waves)


def test_too_few_urls_for_the_waves_is_one_line_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"^SOAK_URLS=7 is too few for 4 waves of 300 s: give at least 400$"):
        plan(46, 7, 300.0)
