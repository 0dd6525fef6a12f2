"""The soak checker's judgements that need no service (tests/soak/checker.py): memory growth over
the second half of each long-lived life only, and queues left with messages, from figures given
as a management API would answer them."""

from __future__ import annotations

from typing import Any

from tests.soak.checker import memory, processes, queues

Samples = list[tuple[float, dict[str, tuple[int, int]]]]


def test_memory_judges_each_long_lived_life_over_its_own_second_half() -> None:
    samples: Samples = [
        (0.0, {"worker": (1, 60_000), "frontier": (2, 50_000)}),
        (50.0, {"worker": (1, 61_000), "frontier": (2, 50_000)}),
        (100.0, {"worker": (1, 64_000), "frontier": (4, 90_000), "late": (3, 40_000)}),
        (400.0, {"worker": (1, 64_500), "frontier": (4, 91_000), "late": (3, 80_000)}),
        (700.0, {"worker": (1, 66_000), "frontier": (4, 95_000), "late": (3, 80_000)}),
    ]
    verdict = memory(samples, soak_s=700.0)
    # Three lives of at least 525 s: the worker's, judged from 400 s (its midpoint is 350 s),
    # +2.3 %; the frontier's second (pid 4) and `late`, both from 100 s, judged from 400 s:
    # +4.4 % and +0 %. The frontier's first life (pid 2) and its 80 % jump at restart are not.
    assert verdict.figures["long_lived_s"] == 525
    assert verdict.figures["lives_judged"] == 3
    assert verdict.figures["largest_growth_pct"] == 4.4
    assert verdict.ok


def test_memory_leaves_out_lives_shorter_than_ten_minutes_in_a_long_soak() -> None:
    samples: Samples = [
        (0.0, {"worker": (1, 50_000), "frontier": (2, 10_000)}),
        (300.0, {"worker": (1, 50_000), "frontier": (2, 90_000)}),  # 300 s of warming up: not judged
        (1_800.0, {"worker": (1, 51_000), "frontier": (3, 10_000)}),
    ]
    verdict = memory(samples, soak_s=1_800.0)
    assert verdict.figures["long_lived_s"] == 600
    assert list(verdict.figures["rss_mb_end"]) == ["worker (pid 1)"]
    assert verdict.ok


def test_memory_fails_a_life_that_grew_ten_percent_or_more_over_its_second_half() -> None:
    samples: Samples = [
        (0.0, {"worker": (1, 50_000)}),
        (50.0, {"worker": (1, 60_000)}),
        (100.0, {"worker": (1, 66_000)}),
    ]
    verdict = memory(samples, soak_s=100.0)
    assert not verdict.ok
    assert verdict.problems == ["worker (pid 1): RSS 58 MB -> 64 MB (+10 %)"]


def test_memory_fails_when_no_process_lived_long_enough_to_judge() -> None:
    samples: Samples = [(0.0, {"a": (1, 1)}), (50.0, {"a": (2, 1)}), (100.0, {"a": (2, 1)})]
    assert memory(samples, soak_s=100.0).problems == ["no process lived 75 s to be judged"]


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
