"""Round-robin rotation: a benched proxy's turns are shared evenly by the proxies still in use."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from shared.errors import TransientError
from shared.http.proxies import Proxy, ProxyPool, parse_proxies
from tests.fakes import FakeTime


class FakeBench:
    """The Bench protocol on a fake clock: one failure benches a proxy for `bench_s`."""

    def __init__(self, clock: FakeTime, bench_s: float) -> None:
        self._clock = clock
        self._bench_s = bench_s
        self._until: dict[str, float] = {}

    def benched_s(self, labels: Sequence[str]) -> list[float]:
        return [max(0.0, self._until.get(label, 0.0) - self._clock()) for label in labels]

    def failed(self, label: str) -> bool:
        self._until[label] = self._clock() + self._bench_s
        return True


def three() -> list[Proxy]:
    return parse_proxies("http://127.0.0.1:3001,http://127.0.0.1:3002,http://127.0.0.1:3003")


def requests_per_proxy(pool: ProxyPool, clock: FakeTime, requests: int) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(requests):
        counts[pool.choose().label] += 1
        clock.now += 0.1
    return counts


def test_every_proxy_takes_its_turn_when_none_is_benched() -> None:
    clock = FakeTime()
    proxies = three()
    pool = ProxyPool(proxies, "round_robin", FakeBench(clock, bench_s=60.0))

    assert [pool.choose() for _ in range(6)] == proxies + proxies


def test_a_benched_proxys_turns_are_spread_evenly_over_the_others() -> None:
    clock = FakeTime()
    first, second, third = three()
    pool = ProxyPool([first, second, third], "round_robin", FakeBench(clock, bench_s=1000.0))
    # The first of the list: taking "the next one in the list" would give all its turns to its
    # neighbour, 2:1 against the third.
    pool.failed(first, TransientError("proxy_error"))

    counts = requests_per_proxy(pool, clock, 301)

    assert first.label not in counts
    assert sum(counts.values()) == 301
    assert abs(counts[second.label] - counts[third.label]) <= 1


def test_a_proxy_back_from_the_bench_shares_the_load_evenly_again() -> None:
    clock = FakeTime()
    first, second, third = three()
    pool = ProxyPool([first, second, third], "round_robin", FakeBench(clock, bench_s=10.0))
    pool.failed(second, TransientError("proxy_error"))

    while_benched = requests_per_proxy(pool, clock, 99)  # 9.9 s: the bench is not over yet
    clock.now = 10.0
    after = requests_per_proxy(pool, clock, 300)

    assert second.label not in while_benched
    assert abs(while_benched[first.label] - while_benched[third.label]) <= 1
    assert sorted(after) == sorted(p.label for p in (first, second, third))
    assert max(after.values()) - min(after.values()) <= 1
