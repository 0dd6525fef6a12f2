"""The soak checker's judgements that need no service (tests/soak/checker.py): memory growth of
each process over the second half of its own life, and queues left with messages, from figures
given as a management API would answer them."""

from __future__ import annotations

from typing import Any

from tests.soak.checker import memory, processes, queues

Samples = list[tuple[float, dict[str, tuple[int, int]]]]


def test_memory_judges_each_process_over_the_second_half_of_its_own_life() -> None:
    samples: Samples = [
        (0.0, {"worker": (1, 50_000), "frontier": (2, 50_000)}),
        (25.0, {"worker": (1, 60_000), "frontier": (2, 50_000)}),
        (50.0, {"worker": (1, 61_000), "frontier.2": (4, 40_000), "late": (3, 30_000)}),
        (75.0, {"worker": (1, 63_000), "frontier.2": (4, 44_000), "late": (3, 40_000)}),
        (100.0, {"worker": (1, 66_000), "frontier.2": (4, 43_000)}),
    ]
    verdict = memory(samples, min_life_s=40.0)
    # worker lived 0-100 s, judged 50 -> 100 s (+8.2 %); frontier.2, started again after the
    # first frontier was killed, lived 50-100 s, judged 75 -> 100 s; the first frontier and
    # `late` lived 25 s each, too short to judge.
    assert verdict.figures == {
        "processes": 2,
        "largest_growth_pct": 8.2,
        "rss_mb_end": {"frontier.2": 42, "worker": 64},
    }
    assert verdict.ok


def test_memory_fails_a_process_that_grew_ten_percent_or_more() -> None:
    samples: Samples = [
        (0.0, {"worker": (1, 50_000)}),
        (50.0, {"worker": (1, 60_000)}),
        (100.0, {"worker": (1, 66_000)}),
    ]
    verdict = memory(samples, min_life_s=40.0)
    assert not verdict.ok
    assert verdict.problems == ["worker: RSS 58 MB -> 64 MB (+10 %)"]


def test_memory_fails_when_no_process_lived_long_enough_to_judge() -> None:
    samples: Samples = [(0.0, {"a": (1, 1)}), (50.0, {"a": (2, 1)}), (100.0, {"a": (3, 1)})]
    assert memory(samples, min_life_s=40.0).problems == [
        "no process lived 40 s or more, long enough to judge"
    ]


def test_queues_name_every_queue_with_messages_ready_or_unacked() -> None:
    listed = [
        {"name": "soak.bulk", "messages_ready": 0, "messages_unacknowledged": 0},
        {"name": "soak.dead", "messages_ready": 2, "messages_unacknowledged": 0},
        {"name": "soak.render", "messages_ready": 0, "messages_unacknowledged": 1},
        {"name": "soak.ttl"},  # a queue the management API has no figures for yet
    ]
    asked: list[str] = []

    def get(url: str) -> Any:
        asked.append(url)
        return listed

    verdict = queues(get, "http://127.0.0.1:1")
    assert asked == ["http://127.0.0.1:1/api/queues?columns=name,messages_ready,messages_unacknowledged"]
    assert verdict.figures == {"queues": 4, "messages_left": 3}
    assert verdict.problems == ["soak.dead: 2 ready, 0 unacked", "soak.render: 0 ready, 1 unacked"]


def test_a_traceback_fails_and_a_designed_exit_does_not() -> None:
    assert processes(["dlq_consumer.2 (exit 2): cannot reach PostgreSQL"], []).ok
    assert processes([], ["worker.3.log"]).problems == ["a traceback in worker.3.log"]
