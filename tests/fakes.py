"""Small fakes shared by the tests: one of each, so that a change to the interface one stands in
for is made once, and mypy checks every test that uses it against the real signature.

A fake that only one test file needs stays in that file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from shared.errors import ServiceUnavailable
from shared.settings import Settings
from worker.politeness.domain_limiter import Reservation


class FakeTime:
    """A clock that moves only when someone sleeps, or a test sets `now`.

    It is every form of clock the code takes: `clock()`, `time()` and the instance itself
    called; `sleep` records each pause in `slept`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def __call__(self) -> float:
        return self.now


class FakeLimiter:
    """The shared rate limiter (worker.politeness.ratelimit.RateLimiter), answering from lists given in
    advance and recording what it was asked.

    Each reservation gets the next of `answers` (the last repeats; a go at once if none given).
    Each clear_to_send gets the next of `clearances`, then, once they are used up, a pause of
    `paused` seconds if that is set (another worker's 429, say), else a go."""

    def __init__(
        self,
        *answers: Reservation,
        clearances: list[tuple[bool, float, str]] | None = None,
        paused_s: float = 0.0,
        answered: Callable[[], None] = lambda: None,
    ) -> None:
        self.answers = list(answers) or [Reservation(0.0, True)]
        self.answered = answered  # called as each reservation is answered: a test's clock may move
        self.clearances = list(clearances or [])
        self.paused = paused_s
        self.calls: list[tuple[float, float, int]] = []  # (rate, max wait, max concurrent)
        self.spacings: list[float] = []
        self.held_clears: list[int] = []  # the cap each clear_held call was given
        self.held_ahead: list[float] = []  # how far ahead each clear_held call may clear
        self.released: list[str] = []
        self.spaced_from_now: list[float] = []  # the spacing of each space_from_now
        self.pauses: list[float] = []
        self.slowed: list[float] = []  # the rate each slow_down was given
        self.slowed_why: list[tuple[str, int]] = []  # and why, and the burst it needs

    @property
    def rates(self) -> list[float]:
        return [rate for rate, _, _ in self.calls]

    def reserve(
        self,
        domain: str,
        rate_per_s: float,
        burst: int = 1,
        *,
        max_wait_s: float,
        max_concurrent: int = 0,
        lease_s: float = 0.0,
        lease_within_s: float | None = None,
    ) -> Reservation:
        self.calls.append((rate_per_s, max_wait_s, max_concurrent))
        self.answered()
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def release(self, domain: str, lease: str) -> None:
        self.released.append(lease)

    def clear_to_send(self, domain: str, spacing_s: float) -> tuple[bool, float, str]:
        self.spacings.append(spacing_s)
        if self.clearances:
            return self.clearances.pop(0)
        return (False, self.paused, "paused") if self.paused else (True, 0.0, "ok")

    def clear_held(
        self,
        domain: str,
        spacing_s: float,
        max_concurrent: int = 0,
        lease_s: float = 0.0,
        ahead_s: float = 0.0,
    ) -> tuple[bool, float, str, str]:
        """As clear_to_send, for a held slot; a cleared one with a concurrency cap gets a lease.
        A clearance given as (True, wait, 'ok') is a send cleared `wait` ahead."""
        self.held_clears.append(max_concurrent)
        self.held_ahead.append(ahead_s)
        cleared, wait_s, reason = self.clear_to_send(domain, spacing_s)
        return cleared, wait_s, reason, "held-lease" if cleared and max_concurrent else ""

    def space_from_now(self, domain: str, spacing_s: float) -> None:
        self.spaced_from_now.append(spacing_s)

    def pause(self, domain: str, seconds: float) -> None:
        self.pauses.append(seconds)

    def slow_down(self, domain: str, rate_per_s: float, why: str = "429", burst: int = 1) -> float:
        self.slowed.append(rate_per_s)
        self.slowed_why.append((why, burst))
        return 2.0


class FakeRunStates:
    """The state of each run (shared.redis.runstate): `running` unless given, e.g.
    FakeRunStates(r1="paused"). Records the runs asked about."""

    def __init__(self, **states: str) -> None:
        self.states = states
        self.asked: list[str] = []
        self.read_ahead_runs: list[str] = []  # each read_ahead, in order
        self.dropped = 0

    def state(self, run_id: str) -> str:
        self.asked.append(run_id)
        return self.states.get(run_id, "running")

    def read_ahead(self, run_id: str) -> None:
        self.read_ahead_runs.append(run_id)

    def drop_read_ahead(self) -> None:
        self.dropped += 1


class FakeDeadLetterConnection:
    """Enough of a psycopg connection to write dead letters (dlq_consumer.store.RecordWriter):
    records the parameters of each statement, and fails its commit, as a lost server does,
    when told to."""

    def __init__(self, fail_commit: bool = False) -> None:
        self.fail_commit = fail_commit
        self.executed: list[Any] = []
        self.commits = 0
        self.closed = False

    def execute(self, query: object, params: Any = None) -> None:
        self.executed.append(params)

    def commit(self) -> None:
        if self.fail_commit:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        self.commits += 1

    def close(self) -> None:
        self.closed = True


class FakeConnector:
    """Hands out the connections it was given, one per call, in turn."""

    def __init__(self, *connections: FakeDeadLetterConnection) -> None:
        self.waiting = list(connections)
        self.opened: list[FakeDeadLetterConnection] = []

    def __call__(self, _settings: Settings) -> FakeDeadLetterConnection:
        conn = self.waiting.pop(0)
        self.opened.append(conn)
        return conn


@dataclass
class Claimed:
    is_new: list[bool]
    token: bytes = b"lease"


@dataclass
class MemoryDedup:
    """The producer's dedup (producer/dedup.py) in a dict: claims, confirms and releases;
    unreachable, as a Redis that is down, for its first `unreachable_calls` calls."""

    unreachable_calls: int = 0
    state: dict[bytes, str] = field(default_factory=dict)

    def _reach(self) -> None:
        if self.unreachable_calls:
            self.unreachable_calls -= 1
            raise ServiceUnavailable("Redis", "127.0.0.1", "refused")

    def claim(self, fingerprints: Sequence[bytes]) -> Claimed:
        self._reach()
        new = [fp not in self.state for fp in fingerprints]
        self.state.update({fp: "claimed" for fp in fingerprints if fp not in self.state})
        return Claimed(new)

    def confirm(self, fingerprints: Sequence[bytes], counters: dict[str, int] | None = None) -> None:
        self._reach()
        self.state.update(dict.fromkeys(fingerprints, "confirmed"))

    def release(self, fingerprints: Sequence[bytes], token: bytes) -> int:
        self._reach()
        for fp in fingerprints:
            self.state.pop(fp, None)
        return len(fingerprints)
