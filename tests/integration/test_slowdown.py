"""The adaptive slow-down in Redis: one cut for all workers, at most once per interval, the
sends of slots reserved before it stretched too, a burst of 403s needed where one 429 does, and
a recovery along the cubic that ends with the key."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator

import pytest
import redis

from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from worker.politeness.ratelimit import BETA, RateLimiter, rate_fraction, slowed_domains


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, OPERATOR)
    yield made
    made.close()


def test_a_cut_is_shared_and_made_once_per_interval(client: redis.Redis, settings: Settings) -> None:
    keys = Keys(settings.redis_prefix)
    one, other = RateLimiter(client, keys, recovery_s=60), RateLimiter(client, keys, recovery_s=60)
    assert one.slow_down("a.example", 10.0, why="429") == pytest.approx(1 / BETA)
    # Another worker's 429 for a request that was already in flight: no second cut.
    assert other.slow_down("a.example", 10.0, why="429") == pytest.approx(1 / BETA, rel=0.01)
    time.sleep(1 / (10.0 * BETA) + 0.02)  # one slowed interval later the overload is news
    assert other.slow_down("a.example", 10.0, why="503") == pytest.approx(1 / BETA**2, rel=0.01)
    fields = client.hgetall(keys.backoff("a.example"))
    # Refused again below the rate it grew towards (1): it now aims under where it was refused.
    assert fields[b"why"] == b"503" and float(fields[b"wmax"]) == pytest.approx(
        BETA * (1 + BETA) / 2, rel=0.01
    )
    assert float(fields[b"w0"]) == pytest.approx(BETA**2, rel=0.01)
    # Every worker's reservation now has the slower rate.
    assert one.reserve("a.example", 10.0, max_wait_s=1.0).backoff == pytest.approx(1 / BETA**2, rel=0.01)
    slowed = slowed_domains(client, keys, 60)
    assert set(slowed) == {"a.example"} and slowed["a.example"].reason == "503"
    assert slowed["a.example"].fraction == pytest.approx(BETA**2, rel=0.01)


def test_a_send_reserved_before_the_cut_is_spaced_at_the_slower_rate(
    client: redis.Redis, settings: Settings
) -> None:
    limiter = RateLimiter(client, Keys(settings.redis_prefix), recovery_s=60)
    # Spacings of seconds, so that a sleep that overshoots on a loaded machine still ends
    # inside the slowed one: 2 s configured, 2 / 0.7 = 2.857 s slowed.
    assert limiter.clear_to_send("b.example", 2.0)[0]
    limiter.slow_down("b.example", 1 / 2.0)  # the rate whose interval is that spacing
    time.sleep(2.2)  # past the configured spacing: unstretched, this send would be cleared
    cleared, wait_s, reason = limiter.clear_to_send("b.example", 2.0)
    # At most what the slowed spacing leaves after the sleep (the rate grows back meanwhile).
    assert (cleared, reason) == (False, "spacing") and 0 < wait_s <= 2.0 / BETA - 2.2, wait_s


def test_one_403_is_a_page_a_burst_of_them_slows_the_domain(client: redis.Redis, settings: Settings) -> None:
    keys = Keys(settings.redis_prefix)
    limiter = RateLimiter(client, keys)
    assert limiter.slow_down("c.example", 5.0, why="403", burst=3) == 1.0
    assert limiter.slow_down("c.example", 5.0, why="403", burst=3) == 1.0
    assert slowed_domains(client, keys, 60) == {}
    assert limiter.slow_down("c.example", 5.0, why="403", burst=3) == pytest.approx(1 / BETA)
    assert 0 < client.pttl(keys.backoff("c.example")) <= 60_000


def test_the_rate_grows_back_along_the_cubic_and_the_key_goes(
    client: redis.Redis, settings: Settings
) -> None:
    keys = Keys(settings.redis_prefix)
    limiter = RateLimiter(client, keys, recovery_s=1.0)
    limiter.slow_down("d.example", 10.0)
    assert 0 < client.pttl(keys.backoff("d.example")) <= 1_000  # a cut from the full rate: R
    time.sleep(0.5)
    multiplier = limiter.reserve("d.example", 10.0, max_wait_s=1.0).backoff
    # Half-way the cubic has climbed most of the way: 1 - 0.3 * 0.5^3 of the rate.
    assert 1 / multiplier == pytest.approx(rate_fraction(1.0, 0.5, 1.0), abs=0.02)
    assert rate_fraction(1.0, 0.5, 1.0) == pytest.approx(1 - (1 - BETA) * 0.125)
    time.sleep(0.6)
    assert client.exists(keys.backoff("d.example")) == 0
    assert limiter.reserve("d.example", 10.0, max_wait_s=1.0).backoff == 1.0


def test_the_cubic_lingers_near_the_rate_that_was_refused() -> None:
    # Refused at 40% of the configured rate: cut to 28%, back at 40% after R * cbrt(0.4) and
    # flat around it, then past it.
    k = 0.4 ** (1 / 3) * 30
    assert rate_fraction(0.4, 0.0, 30) == pytest.approx(0.28)
    assert rate_fraction(0.4, k, 30) == pytest.approx(0.4)
    assert rate_fraction(0.4, k - 3, 30) > 0.399 and rate_fraction(0.4, k + 3, 30) < 0.401
    assert rate_fraction(0.4, 3 * k, 30) == 1.0


def test_rate_jitter_spreads_the_slots_between_one_and_one_and_a_half_intervals(
    client: redis.Redis, settings: Settings
) -> None:
    keys = Keys(settings.redis_prefix)

    def slots(limiter: RateLimiter, domain: str) -> list[float]:
        """The gaps, in seconds, between the slots 40 reservations in a row were given."""
        times = []
        for _ in range(40):
            limiter.reserve(domain, 10.0, max_wait_s=10.0)
            times.append(int(client.get(keys.rate(domain)) or 0) / 1e6)  # the TAT after each
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    jittered = slots(RateLimiter(client, keys, jitter=0.5, rng=random.Random(7)), "e.example")
    # 100 ms apart at 10/s (a call takes far less), each lengthened by a random share of up to half.
    assert all(0.0999 < gap < 0.1501 for gap in jittered), jittered
    assert max(jittered) - min(jittered) > 0.03  # not evenly spaced
    even = slots(RateLimiter(client, keys), "f.example")
    assert all(abs(gap - 0.1) < 1e-5 for gap in even), even
