"""Politeness config, Retry-After parsing and the domain gate, with a fake limiter."""

from __future__ import annotations

import dataclasses
import email.utils
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from shared.errors import ConfigError, PermanentError
from shared.settings import Settings
from shared.try_later import HeldSlot, TryLater
from tests.fakes import FakeLimiter, FakeTime
from worker.fetch.verdicts import Throttled, parse_retry_after
from worker.politeness.config import DomainPolicy, PolitenessConfig
from worker.politeness.domain_limiter import Reservation
from worker.politeness.gate import (
    BUSY_RETRY_S,
    CLEAR_AHEAD_S,
    FORBIDDEN_BURST,
    RATE_HEADROOM,
    DomainGate,
)

SETTINGS = Settings(rate_limit_rps=2.0, max_concurrent_per_domain=8, max_inline_wait_s=1.0)


def config_from(tmp_path: Path, text: str, settings: Settings = SETTINGS) -> PolitenessConfig:
    path = tmp_path / "politeness.toml"
    path.write_text(text, encoding="utf-8")
    return PolitenessConfig.from_settings(dataclasses.replace(settings, politeness_file=str(path)))


def test_without_a_file_every_domain_gets_the_settings() -> None:
    config = PolitenessConfig.from_settings(SETTINGS)
    assert config.policy_for("any.example") == DomainPolicy(2.0, 8)


def test_a_domain_line_overrides_only_what_it_names(tmp_path: Path) -> None:
    config = config_from(
        tmp_path,
        '[domains."127.0.0.2:8431"]\nrate_limit_rps = 5\nmax_concurrent = 2\n'
        '[domains."Slow.Example"]\nrate_limit_rps = 0.5\n',
    )
    assert config.policy_for("127.0.0.2:8431") == DomainPolicy(5.0, 2)
    assert config.policy_for("slow.example") == DomainPolicy(0.5, 8)  # case-insensitive
    assert config.policy_for("127.0.0.2") == DomainPolicy(2.0, 8)  # another port, another domain


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[domains."a"]\nrate = 5\n', "unknown key"),
        ('[domains."a"]\nmax_concurrent = 1.5\n', "expected a int"),
        ('[domains."a"]\nrate_limit_rps = "fast"\n', "expected a float"),
        ('[domains."a"]\nrate_limit_rps = 0\n', "must be positive"),
        ('[domains."a"]\nmax_concurrent = true\n', "expected a int"),
        ("[hosts]\n", "unknown table"),
        ("domains = 3\n", "must be a table"),
        ("[domains\n", "politeness.toml"),
    ],
)
def test_config_mistakes_name_the_file_and_key(tmp_path: Path, text: str, complaint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from(tmp_path, text)
    assert complaint in str(caught.value)
    assert "politeness.toml" in str(caught.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    settings = dataclasses.replace(SETTINGS, politeness_file=str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="POLITENESS_FILE"):
        PolitenessConfig.from_settings(settings)


@pytest.mark.parametrize(("delay", "rate"), [(None, 5.0), (0.0, 5.0), (0.1, 5.0), (2.0, 0.5)])
def test_crawl_delay_only_ever_lowers_the_rate(delay: float | None, rate: float) -> None:
    assert DomainPolicy(5.0, 1).rate_per_s(delay) == pytest.approx(rate)


def test_retry_after_in_seconds_and_as_a_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("2", now) == 2.0
    assert parse_retry_after(" 120 ", now) == 120.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    for unusable in (None, "", "soon", "-5", "1.5"):
        assert parse_retry_after(unusable, now) is None


def gate_with(limiter: FakeLimiter, settings: Settings = SETTINGS) -> tuple[DomainGate, FakeTime]:
    fake = FakeTime()
    return DomainGate(
        limiter, PolitenessConfig.from_settings(settings), settings, fake.sleep, fake.clock
    ), fake


def test_a_slot_already_cleared_by_the_reservation_is_sent_without_asking_again() -> None:
    limiter = FakeLimiter(Reservation(0.0, True, lease="L", cleared=True))
    gate, fake = gate_with(limiter)
    assert gate.call("a.example", lambda: "body") == "body"
    assert limiter.spacings == []  # no clear_to_send round trip
    assert (limiter.released, fake.slept) == (["L"], [])


def test_a_request_spaced_from_its_answer_moves_the_latest_send_once_answered() -> None:
    limiter = FakeLimiter(Reservation(0.0, True, cleared=True))
    gate, _ = gate_with(limiter)
    assert gate.call("a.example", lambda: "robots", spaced_from_answer=True) == "robots"
    assert limiter.spaced_from_now == [pytest.approx(RATE_HEADROOM / SETTINGS.rate_limit_rps)]
    assert gate.call("a.example", lambda: "page") == "page"
    assert len(limiter.spaced_from_now) == 1  # pages are spaced from their clearance


def test_a_granted_slot_is_waited_for_then_sent_then_released() -> None:
    limiter = FakeLimiter(Reservation(0.4, True, lease="L"))
    gate, fake = gate_with(limiter)
    assert gate.call("a.example", lambda: "sent") == "sent"
    assert fake.slept == [0.4] and limiter.released == ["L"]
    rate, max_wait, cap = limiter.calls[0]
    assert rate == pytest.approx(2.0 / RATE_HEADROOM) and (max_wait, cap) == (1.0, 8)


def test_a_long_wait_is_try_later_and_nothing_is_sent() -> None:
    gate, fake = gate_with(FakeLimiter(Reservation(7.5, False, "paused")))
    sent: list[str] = []
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: sent.append("x"))
    # Back when the slot is within the 1 s in-process wait, not when it is due.
    assert (caught.value.wait_s, caught.value.reason) == (6.5, "paused")
    assert sent == [] and fake.slept == []


def test_a_request_too_close_behind_the_previous_one_waits_the_difference() -> None:
    # The previous request left late; ours must not follow it closer than the spacing.
    limiter = FakeLimiter(Reservation(0.2, True, backoff=2.0), clearances=[(False, 0.03, "spacing")])
    gate, fake = gate_with(limiter)
    sent: list[float] = []
    gate.call("a.example", lambda: sent.append(fake.now))
    assert fake.slept == [0.2, 0.03] and sent == [pytest.approx(0.23)]
    # 1.05 / 2 req/s: the limiter itself stretches it by the domain's slow-down as it is now
    assert limiter.spacings == [pytest.approx(RATE_HEADROOM / 2.0)] * 2


def test_a_pause_found_just_before_sending_is_try_later() -> None:
    limiter = FakeLimiter(Reservation(0.5, True, lease="L"), clearances=[(False, 3.0, "paused")])
    gate, _ = gate_with(limiter)
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: pytest.fail("sent during a pause"))
    assert (caught.value.wait_s, caught.value.reason) == (3.0, "paused")
    assert limiter.released == ["L"]


def test_never_cleared_to_send_defers_the_url() -> None:
    limiter = FakeLimiter(Reservation(0.0, True), clearances=[(False, 0.01, "spacing")] * 10)
    gate, _ = gate_with(limiter)
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: pytest.fail("sent too close"))
    assert caught.value.reason == "spacing"


def test_a_busy_domain_is_polled_until_a_slot_frees() -> None:
    limiter = FakeLimiter(
        Reservation(0.0, False, "busy"), Reservation(0.0, False, "busy"), Reservation(0.0, True)
    )
    gate, fake = gate_with(limiter)
    assert gate.call("a.example", lambda: 1) == 1
    assert len(limiter.calls) == 3 and 0 < sum(fake.slept) < 1.0
    assert limiter.calls[2][1] < limiter.calls[0][1]  # the remaining wait budget shrinks


def test_a_busy_domain_past_the_inline_wait_is_try_later() -> None:
    gate, fake = gate_with(FakeLimiter(Reservation(0.0, False, "busy")))
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: 1)
    assert (caught.value.wait_s, caught.value.reason) == (BUSY_RETRY_S, "busy")
    assert sum(fake.slept) == pytest.approx(1.0)


class CappedLimiter(FakeLimiter):
    """a.example's concurrency slots are all taken until `free.set()`, other domains' never.
    Records which threads asked for a.example again while it was busy (a thread's first ask
    comes before it can know). Thread-safe, unlike its parent."""

    def __init__(self) -> None:
        super().__init__()
        self.free = threading.Event()
        self.asked = threading.Condition()
        self.first_askers: set[int] = set()
        self.busy_again: list[int] = []  # the thread of each repeat ask refused as busy

    def reserve(self, domain: str, rate_per_s: float, burst: int = 1, **_: object) -> Reservation:
        if domain.lower() != "a.example" or self.free.is_set():
            return Reservation(0.0, True, cleared=True)
        with self.asked:
            me = threading.get_ident()
            if me in self.first_askers:
                self.busy_again.append(me)
            self.first_askers.add(me)
            self.asked.notify_all()
        return Reservation(0.0, False, "busy")

    def wait_until(self, done: Callable[[], bool]) -> None:
        with self.asked:
            assert self.asked.wait_for(done, timeout=30)


def a_gate(limiter: CappedLimiter) -> DomainGate:
    settings = dataclasses.replace(SETTINGS, max_inline_wait_s=60.0)  # nobody gives up here
    return DomainGate(limiter, PolitenessConfig.from_settings(settings), settings)


def test_threads_refused_for_a_busy_domain_line_up_behind_one_that_asks() -> None:
    limiter = CappedLimiter()
    gate = a_gate(limiter)
    sent: list[int] = []
    threads = [
        threading.Thread(target=lambda n=n: sent.append(gate.call("A.example", lambda: n))) for n in range(6)
    ]
    for thread in threads:
        thread.start()
    limiter.wait_until(lambda: len(limiter.first_askers) == 6 and len(limiter.busy_again) >= 10)
    limiter.free.set()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(sent) == list(range(6))
    # Only the head of the line asked again; alone, each of the six would have polled.
    assert len(set(limiter.busy_again)) == 1


def test_a_busy_line_holds_up_only_its_own_domain() -> None:
    limiter = CappedLimiter()
    gate = a_gate(limiter)
    sent: list[str] = []
    ahead = threading.Thread(target=lambda: sent.append(gate.call("a.example", lambda: "ahead")))
    ahead.start()
    limiter.wait_until(lambda: len(limiter.busy_again) >= 1)  # at the head, polling
    assert gate.call("b.example", lambda: "b") == "b"
    behind = threading.Thread(target=lambda: sent.append(gate.call("a.example", lambda: "behind")))
    behind.start()
    limiter.wait_until(lambda: len(limiter.first_askers) == 2)
    ahead_polls = len(limiter.busy_again)
    limiter.wait_until(lambda: len(limiter.busy_again) >= ahead_polls + 3)
    assert ahead.is_alive() and behind.is_alive()
    limiter.free.set()
    ahead.join(timeout=30)
    behind.join(timeout=30)
    assert sorted(sent) == ["ahead", "behind"]
    assert set(limiter.busy_again) == {ahead.ident}  # behind waited without asking


def test_retry_after_pauses_the_domain_no_longer_than_the_cap() -> None:
    limiter = FakeLimiter(Reservation(0.0, True, lease="L"))
    gate, _ = gate_with(limiter, dataclasses.replace(SETTINGS, max_domain_pause_s=60.0))
    for retry_after in (2.0, 86_400.0):

        def answer(delay: float = retry_after) -> None:
            raise Throttled("http_429", "", 429, delay)

        with pytest.raises(Throttled):
            gate.call("a.example", answer)
    assert limiter.pauses == [2.0, 60.0] and limiter.slowed == []
    assert limiter.released == ["L", "L"]


def test_throttling_without_retry_after_slows_the_domain_at_its_rate() -> None:
    limiter = FakeLimiter(Reservation(0.0, True))
    gate, _ = gate_with(limiter)

    def answer() -> None:
        raise Throttled("http_503", "", 503, None)

    with pytest.raises(Throttled):
        gate.call("a.example", answer, crawl_delay_s=4.0)
    assert limiter.slowed == [0.25] and limiter.pauses == []


def test_a_burst_of_403s_may_slow_the_domain_a_single_429_does() -> None:
    limiter = FakeLimiter(Reservation(0.0, True))
    gate, _ = gate_with(limiter)

    def forbidden() -> None:
        raise PermanentError("http_403", "", 403)

    def gone() -> None:
        raise PermanentError("http_404", "", 404)

    for answer in (forbidden, gone, forbidden):
        with pytest.raises(PermanentError):
            gate.call("a.example", answer)
    # Each 403 is counted by the shared limiter, which slows down at the third in its window.
    assert limiter.slowed_why == [("403", FORBIDDEN_BURST), ("403", FORBIDDEN_BURST)]


def test_rising_latency_slows_the_domain_once_and_steady_latency_does_not() -> None:
    limiter = FakeLimiter(Reservation(0.0, True))
    gate, fake = gate_with(limiter)

    def answer_in(seconds: float) -> None:
        fake.now += seconds

    for _ in range(30):
        gate.call("a.example", lambda: answer_in(0.02))
    assert limiter.slowed_why == []
    for _ in range(8):
        gate.call("a.example", lambda: answer_in(0.5))
    assert limiter.slowed_why == [("latency", 1)]


def test_a_slowed_domain_costs_no_extra_round_trip_per_page() -> None:
    """The rate recovers by itself in time: a success writes nothing."""
    limiter = FakeLimiter(Reservation(0.0, True, backoff=4.0))
    gate, _ = gate_with(limiter)
    gate.call("a.example", lambda: None)
    assert limiter.slowed == [] and limiter.pauses == []


def wait_metrics() -> tuple[float, float]:
    return (
        REGISTRY.get_sample_value("crawl_rate_limit_waits_total") or 0.0,
        REGISTRY.get_sample_value("crawl_rate_limit_wait_seconds_total") or 0.0,
    )


def test_a_request_held_back_counts_one_wait_with_every_second_it_slept() -> None:
    limiter = FakeLimiter(
        Reservation(0.0, False, "busy"), Reservation(0.25, True), clearances=[(False, 0.03, "spacing")]
    )
    gate, fake = gate_with(limiter)
    waits, seconds = wait_metrics()

    gate.call("a.example", lambda: 1)

    after_waits, after_seconds = wait_metrics()
    assert after_waits - waits == 1  # one busy poll, the slot and the spacing: one request held back
    assert after_seconds - seconds == pytest.approx(sum(fake.slept)) == pytest.approx(0.05 + 0.25 + 0.03)


def test_a_request_sent_at_once_counts_no_wait_and_a_deferred_one_counts_its_sleep() -> None:
    waits, seconds = wait_metrics()
    gate, _ = gate_with(FakeLimiter(Reservation(0.0, True, cleared=True)))
    gate.call("a.example", lambda: 1)
    assert wait_metrics() == (waits, seconds)

    gate, fake = gate_with(FakeLimiter(Reservation(0.0, False, "busy")))
    with pytest.raises(TryLater):
        gate.call("a.example", lambda: 1)
    after_waits, after_seconds = wait_metrics()
    assert after_waits - waits == 1
    assert after_seconds - seconds == pytest.approx(sum(fake.slept))


# Held slots: a caller that can hold its URL gets a slot reserved up to MAX_HOLD_S ahead.


def test_a_slot_beyond_the_inline_wait_is_reserved_and_handed_out_to_hold() -> None:
    limiter = FakeLimiter(Reservation(12.0, True, backoff=2.0))
    gate, fake = gate_with(limiter)
    sent: list[str] = []
    with pytest.raises(TryLater) as caught:
        gate.call("A.example", lambda: sent.append("x"), may_hold=True)
    assert caught.value.wait_s == 12.0
    assert caught.value.slot == HeldSlot("a.example", 12.0, 2.0)
    _, max_wait, _ = limiter.calls[0]
    assert max_wait == SETTINGS.max_hold_s and sent == [] and fake.slept == []


def test_a_slot_beyond_the_hold_horizon_comes_back_when_it_is_within_it() -> None:
    gate, _ = gate_with(FakeLimiter(Reservation(1000.0, False, "rate")))
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: "x", may_hold=True)
    horizon = SETTINGS.max_hold_s
    assert (caught.value.wait_s, caught.value.slot) == (1000.0 - horizon, None)


def test_a_slot_just_beyond_the_hold_horizon_is_not_asked_for_again_at_once() -> None:
    gate, _ = gate_with(FakeLimiter(Reservation(SETTINGS.max_hold_s + 0.01, False, "rate")))
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: "x", may_hold=True)
    assert caught.value.wait_s == SETTINGS.max_hold_s / 4


def test_a_held_slot_is_sent_after_one_check_without_a_new_reservation() -> None:
    limiter = FakeLimiter(Reservation(0.0, False, "unused"))
    gate, fake = gate_with(limiter)
    fake.now = 9.9  # the timer handed it back a little early
    slot = HeldSlot("a.example", 10.0, 1.0)
    assert gate.call("a.example", lambda: "sent", slot=slot) == "sent"
    assert limiter.calls == [] and limiter.held_clears == [8]
    assert fake.slept == [pytest.approx(0.1)] and limiter.released == ["held-lease"]


def test_a_held_slot_too_close_behind_the_previous_request_waits_the_difference() -> None:
    limiter = FakeLimiter(Reservation(0.0, False), clearances=[(False, 0.04, "spacing")])
    gate, fake = gate_with(limiter)
    assert gate.call("a.example", lambda: "sent", slot=HeldSlot("a.example", 0.0)) == "sent"
    assert fake.slept == [0.04] and len(limiter.held_clears) == 2


def test_a_held_slot_cleared_ahead_sleeps_the_rest_of_the_spacing_and_sends_without_asking_again() -> None:
    limiter = FakeLimiter(Reservation(0.0, False), clearances=[(True, 0.02, "ok")])
    gate, fake = gate_with(limiter)
    sent_at: list[float] = []

    def send() -> str:
        sent_at.append(fake.now)
        return "sent"

    assert gate.call("a.example", send, slot=HeldSlot("a.example", 0.0)) == "sent"
    assert fake.slept == [0.02] and sent_at == [pytest.approx(0.02)]
    assert len(limiter.held_clears) == 1 and limiter.held_ahead == [CLEAR_AHEAD_S]


def oversleeping_gate(limiter: FakeLimiter, over_s: float) -> tuple[DomainGate, FakeTime]:
    """A gate whose every sleep lasts `over_s` longer than asked: a thread waking late."""
    fake = FakeTime()

    def sleep(seconds: float) -> None:
        fake.sleep(seconds + over_s)

    return DomainGate(limiter, PolitenessConfig.from_settings(SETTINGS), SETTINGS, sleep, fake.clock), fake


SPACING_S = RATE_HEADROOM / SETTINGS.rate_limit_rps


def test_a_send_cleared_ahead_that_wakes_late_spaces_the_next_request_from_its_real_time() -> None:
    limiter = FakeLimiter(Reservation(0.0, False), clearances=[(True, 0.02, "ok")])
    gate, _ = oversleeping_gate(limiter, 0.1)
    assert gate.call("a.example", lambda: "sent", slot=HeldSlot("a.example", 0.0)) == "sent"
    assert limiter.spaced_from_now == [pytest.approx(SPACING_S)]


def test_a_send_late_by_less_than_the_headroom_covers_costs_no_round_trip() -> None:
    limiter = FakeLimiter(Reservation(0.0, False), clearances=[(True, 0.02, "ok")])
    gate, _ = oversleeping_gate(limiter, 0.015)  # the headroom covers 25 ms at 2/s
    assert gate.call("a.example", lambda: "sent", slot=HeldSlot("a.example", 0.0)) == "sent"
    assert limiter.spaced_from_now == []


def test_a_send_whose_clearance_was_read_late_spaces_the_next_request_from_its_real_time() -> None:
    fake = FakeTime()

    def read_late() -> None:  # the answer reaches the thread 100 ms after the limiter recorded it
        fake.now += 0.1

    limiter = FakeLimiter(Reservation(0.0, True, lease="L", cleared=True), answered=read_late)
    gate = DomainGate(limiter, PolitenessConfig.from_settings(SETTINGS), SETTINGS, fake.sleep, fake.clock)
    assert gate.call("a.example", lambda: "sent") == "sent"
    assert limiter.spaced_from_now == [pytest.approx(SPACING_S)]


def test_a_send_cleared_after_its_wait_is_timed_from_that_clearance_not_from_its_reservation() -> None:
    limiter = FakeLimiter(Reservation(0.4, True, lease="L"))
    gate, fake = oversleeping_gate(limiter, 0.1)  # it woke 100 ms after its slot...
    assert gate.call("a.example", lambda: "sent") == "sent"
    assert fake.slept == [pytest.approx(0.5)] and limiter.spacings == [pytest.approx(SPACING_S)]
    assert limiter.spaced_from_now == []  # ...and was cleared then, with the spacing checked


def test_a_held_slot_that_finds_the_domain_paused_or_busy_too_long_is_try_later() -> None:
    paused = FakeLimiter(Reservation(0.0, False), clearances=[(False, 30.0, "paused")])
    gate, _ = gate_with(paused)
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: "x", slot=HeldSlot("a.example", 0.0))
    assert (caught.value.wait_s, caught.value.reason, caught.value.slot) == (30.0, "paused", None)
    busy = FakeLimiter(Reservation(0.0, False), clearances=[(False, 0.0, "busy")] * 100)
    gate, fake = gate_with(busy)
    with pytest.raises(TryLater) as caught:
        gate.call("a.example", lambda: "x", slot=HeldSlot("a.example", 0.0))
    assert caught.value.reason == "busy" and sum(fake.slept) <= SETTINGS.max_inline_wait_s
    assert busy.released == []


def test_a_held_slot_for_another_domain_is_ignored() -> None:
    limiter = FakeLimiter(Reservation(0.0, True, cleared=True))
    gate, _ = gate_with(limiter)
    assert gate.call("b.example", lambda: "sent", slot=HeldSlot("a.example", 0.0)) == "sent"
    assert len(limiter.calls) == 1 and limiter.held_clears == []
