"""A worker's cached view of run states: one Redis read per run per second at most."""

from __future__ import annotations

from typing import Any

from shared.redis.keys import Keys
from shared.redis.runstate import RunStates, decode_state


class FakeRedis:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.gets: list[str] = []

    def get(self, key: str) -> Any:
        self.gets.append(key)
        return self.values.get(key)


def test_the_state_is_read_once_per_max_age_per_run() -> None:
    client, now = FakeRedis(), [0.0]
    keys = Keys("p")
    states = RunStates(client, keys, max_age_s=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert states.state("r1") == "running"
    client.values[keys.run_state("r1")] = b"paused"
    now[0] = 0.9
    assert states.state("r1") == "running"  # still the cached answer
    assert states.state("r2") == "running"  # another run: read on its own
    now[0] = 1.0
    assert states.state("r1") == "paused"  # seen within the second
    assert client.gets == ["p:run:r1:state", "p:run:r2:state", "p:run:r1:state"]


def test_an_unknown_value_means_running() -> None:
    assert decode_state(None) == "running"
    assert decode_state(b"paused") == "paused"
    assert decode_state(b"cancelled") == "cancelled"
    assert decode_state(b"bogus") == "running"


class FakeReadingAheadRedis(FakeRedis):
    """A client that reads ahead (shared/redis/deferred_writes.py), recording what it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead: list[tuple[str, ...]] = []
        self.drops = 0

    def read_ahead(self, *command: str) -> None:
        self.ahead.append(command)

    def drop_read_ahead(self) -> None:
        self.drops += 1


def test_the_state_is_read_ahead_only_when_the_copy_kept_will_not_answer() -> None:
    client, now = FakeReadingAheadRedis(), [0.0]
    keys = Keys("p")
    states = RunStates(client, keys, max_age_s=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    states.read_ahead("r1")  # nothing kept yet
    assert states.state("r1") == "running"
    now[0] = 0.5
    states.read_ahead("r1")  # kept, and fresh: no read
    now[0] = 1.5
    states.read_ahead("r1")
    states.drop_read_ahead()
    assert client.ahead == [("GET", "p:run:r1:state")] * 2 and client.drops == 1


def test_a_client_that_cannot_read_ahead_is_left_alone() -> None:
    states = RunStates(FakeRedis(), Keys("p"))  # type: ignore[arg-type]
    states.read_ahead("r1")
    states.drop_read_ahead()
    assert states.state("r1") == "running"
