"""The soak checker's judgements that need no service (tests/soak/checker.py): memory growth over
the second half of long-lived processes only, and queues left with messages, from figures given
as a management API would answer them."""

from __future__ import annotations

from typing import Any

from tests.soak.checker import memory, processes, queues

Samples = list[tuple[float, dict[str, tuple[int, int]]]]


def test_memory_judges_only_processes_that_lived_from_the_first_quarter_to_the_end() -> None:
    samples: Samples = [
        (10.0, {"worker": (1, 60_000), "frontier": (2, 50_000)}),
        (60.0, {"worker": (1, 61_000), "frontier": (2, 50_000), "late": (3, 40_000)}),
        (100.0, {"worker": (1, 66_000), "frontier": (4, 90_000), "late": (3, 80_000)}),
    ]
    verdict = memory(samples, mid_s=50.0, born_by_s=25.0)
    # frontier was restarted (a new pid), `late` was born after the first quarter: neither counts.
    assert verdict.figures["processes"] == 1
    assert verdict.figures["largest_growth_pct"] == 8.2
    assert verdict.ok


def test_memory_fails_a_process_that_grew_ten_percent_or_more() -> None:
    samples: Samples = [
        (0.0, {"worker": (1, 50_000)}),
        (50.0, {"worker": (1, 60_000)}),
        (100.0, {"worker": (1, 66_000)}),
    ]
    verdict = memory(samples, mid_s=50.0, born_by_s=25.0)
    assert not verdict.ok
    assert verdict.problems == ["worker: RSS 58 MB -> 64 MB (+10 %)"]


def test_memory_fails_when_no_process_lived_long_enough_to_judge() -> None:
    samples: Samples = [(0.0, {"a": (1, 1)}), (50.0, {"a": (2, 1)}), (100.0, {"a": (2, 1)})]
    assert memory(samples, mid_s=50.0, born_by_s=25.0).problems == [
        "no process lived through the whole second half"
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
