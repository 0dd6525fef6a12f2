"""The frontier's marks of the pages it holds (producer/frontier_redis.py, PagesInHand), read by
ops.crawl's end of a discovery run and by anything else that asks whether its total may grow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from producer.frontier_redis import HOLD_DEADLINE_S, HOLD_REFRESH_S, PagesInHand
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import frontier_holds_a_page
from shared.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, OPERATOR)
    yield made
    made.close()


def test_a_page_held_marks_its_run_until_the_frontier_is_idle_and_no_other_run(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    first, second = PagesInHand(client, keys, "f1"), PagesInHand(client, keys, "f2")
    assert not frontier_holds_a_page(client, keys, "run-a")
    first.hold("run-a")
    assert frontier_holds_a_page(client, keys, "run-a")
    assert not frontier_holds_a_page(client, keys, "run-b")
    second.hold("run-a")
    second.release_all()
    assert frontier_holds_a_page(client, keys, "run-a")  # the other frontier's end is not this one's
    first.release_all()
    assert not frontier_holds_a_page(client, keys, "run-a")
    assert client.exists(keys.run_frontier("run-a")) == 0


def test_pages_in_a_row_set_the_mark_again_only_every_few_seconds(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    now = [1_000_000.0]
    in_hand = PagesInHand(client, keys, "f1", clock=lambda: now[0])
    mark = keys.run_frontier("run-a")
    in_hand.hold("run-a")
    first = int(client.hget(mark, "f1") or 0)
    now[0] += HOLD_REFRESH_S - 1
    in_hand.hold("run-a")
    assert int(client.hget(mark, "f1") or 0) == first  # no call: set a moment ago
    now[0] += 2
    in_hand.hold("run-a")
    assert int(client.hget(mark, "f1") or 0) == first + int((HOLD_REFRESH_S + 1) * 1000)
    in_hand.release_all()
    assert client.exists(mark) == 0


def test_a_mark_left_by_a_frontier_that_died_stops_counting_at_its_deadline(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    deadline_ms = int(client.time()[0] * 1000 + HOLD_DEADLINE_S * 1000)
    client.hset(keys.run_frontier("run-a"), "killed", deadline_ms)  # as a SIGKILL leaves it
    assert frontier_holds_a_page(client, keys, "run-a")
    client.hset(keys.run_frontier("run-a"), "killed", deadline_ms - int(HOLD_DEADLINE_S * 1000) - 1)
    assert not frontier_holds_a_page(client, keys, "run-a")
