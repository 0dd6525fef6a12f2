"""The status view as text, the queue roles and the management listing, without services."""

from __future__ import annotations

from typing import Any

import pytest

from ops.status import management_queues
from ops.status_view import CLEAR_SCREEN, frame, render
from shared.amqp.topology import queue_role
from shared.settings import Settings

NS = "crawl"


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("crawl.priority", "work"),
        ("crawl.bulk", "work"),
        ("crawl.dead", "dead"),
        ("crawl.parked", "parked"),
        ("crawl.retry.500ms", "retry"),
        ("crawl.defer.30000ms", "defer"),
        ("crawl.held.run-7", "held"),  # a paused run's hold queue
        ("crawl.held.", None),
        ("crawl.x.bulk", None),  # a longer namespace
        ("crawl.retry.soon", None),
        ("crawler.bulk", None),
        ("other.bulk", None),
    ],
)
def test_queue_roles_by_name(name: str, role: str | None) -> None:
    assert queue_role(NS, name) == role


def listed(*names: str) -> list[dict[str, Any]]:
    return [
        {"name": n, "messages_ready": i, "messages_unacknowledged": 1, "consumers": 2}
        for i, n in enumerate(names)
    ]


def test_the_management_listing_keeps_the_namespaces_queues_in_role_order() -> None:
    answer = listed(
        "crawl.defer.5000ms", "crawl.retry.30000ms", "crawl.bulk", "crawl.retry.5000ms",
        "crawl.x.bulk", "elsewhere.bulk", "crawl.parked", "crawl.held.r2", "crawl.held.r1",
    )  # fmt: skip

    queues = management_queues(Settings(crawl_namespace=NS), lambda _url: answer)

    assert queues is not None
    assert [(q.name, q.role, q.exists) for q in queues] == [
        ("crawl.priority", "work", False),
        ("crawl.ttl", "work", False),
        ("crawl.bulk", "work", True),
        ("crawl.dead", "dead", False),
        ("crawl.parked", "parked", True),
        ("crawl.retry.5000ms", "retry", True),
        ("crawl.retry.30000ms", "retry", True),
        ("crawl.defer.5000ms", "defer", True),
        ("crawl.held.r1", "held", True),
        ("crawl.held.r2", "held", True),
    ]
    assert (queues[2].ready, queues[2].unacked, queues[2].consumers) == (2, 1, 2)


def test_an_api_that_fails_means_the_fallback() -> None:
    def refuse(_url: str) -> Any:
        raise ValueError("not JSON")

    assert management_queues(Settings(crawl_namespace=NS), refuse) is None


def queue(name: str, role: str, ready: int | None = 3, exists: bool = True) -> dict[str, Any]:
    return {"name": name, "role": role, "exists": exists, "ready": ready, "unacked": 1, "consumers": 2}


def busy_report(*, run: bool) -> dict[str, Any]:
    """More of everything than a screen holds, and names longer than its width."""
    ns = "crawl-namespace-with-a-rather-long-name-for-this-test"
    queues = [queue(f"{ns}.{k}", "work") for k in ("priority", "ttl", "bulk")]
    queues += [queue(f"{ns}.dead", "dead"), queue(f"{ns}.parked", "parked", exists=False)]
    queues += [queue(f"{ns}.retry.{ms}ms", "retry") for ms in (500, 1000, 5000, 30000, 60000)]
    queues += [queue(f"{ns}.defer.{ms}ms", "defer", ready=None) for ms in (1000, 5000, 30000)]
    report: dict[str, Any] = {
        "namespace": ns,
        "queue_source": "management",
        "queues": queues,
        "activity": {
            "window_s": 60,
            "pages_in_window": 900,
            "pages_per_s": 15.0,
            "top_domains": [{"domain": f"host-{n}.example.com", "pages": 100 - n} for n in range(5)],
            "pages_by_worker": {},
            "dead_letters": {f"http_{code}": code for code in range(500, 512)},
        },
        "workers": [
            {"worker_id": f"machine-{n}.example.com-{1000 + n}", "host": "h", "pid": n, "pages_in_window": n}
            for n in range(40)
        ],
    }
    if run:
        report["run"] = {
            "run_id": "demo-20261126-130000-abcd",
            "redis_prefix": "demo",
            "pages": 75,
            "dead_letters": {"http_404": 6, "http_500": 6},
            "replayed": 0,
            "skips": {"robots": 2},
            "counters": {f"enqueued.queue-{n}": n for n in range(30)},
        }
    else:
        report["runs"] = [
            {
                "run_id": f"run-{n}",
                "pages": n,
                "dead_letters": 0,
                "skips": 0,
                "last_activity": "2026-11-26T13:00",
            }
            for n in range(10)
        ]
    return report


@pytest.mark.parametrize("run", [True, False])
def test_a_watch_frame_fits_an_80_by_24_terminal(run: bool) -> None:
    shown = frame(busy_report(run=run), "13:00:00  every 2 s, Ctrl-C to stop", (80, 24))

    assert shown.startswith(CLEAR_SCREEN) and not shown.endswith("\n")  # a newline would scroll
    lines = shown.removeprefix(CLEAR_SCREEN).split("\n")
    assert len(lines) <= 24
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "Ctrl-C to stop" in lines[-1]
    assert lines[0].startswith("queues of crawl-namespace-with-a-rather-long-name")  # named once
    # the delay queues summed per role, with unknowns kept unknown
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:9]}
    assert rows["priority"] == ["work", "3", "1", "2"]
    assert rows["retry.*"] == ["retry", "15", "5", "10"]
    assert rows["defer.*"] == ["defer", "?", "3", "6"]
    assert rows["parked"] == ["parked", "missing"]
    assert "workers running: 40" in text
    if run:
        assert "run demo-20261126-130000-abcd  (Redis prefix demo)" in text
        assert "dead letters 12 (http_404=6 http_500=6), replayed 0" in text
    else:
        assert "latest runs" in text and "more" in text  # the runs that did not fit


def test_the_full_view_lists_every_queue_and_worker() -> None:
    text = render(busy_report(run=True))

    assert text.count(".retry.") == 5 and text.count(".defer.") == 3
    assert "workers running: 40" in text
    assert "machine-39.example.com-1039  h pid 39, 39 pages in the window" in text
    assert "counters       enqueued.queue-0=0" in text and "(Redis prefix demo)" in text


def test_a_small_terminal_gets_a_small_frame() -> None:
    lines = frame(busy_report(run=False), "footer", (40, 10)).removeprefix(CLEAR_SCREEN).split("\n")

    assert len(lines) <= 10 and max(map(len, lines)) <= 40


def test_a_run_s_view_says_what_the_broker_received_once_copies_were_delivered() -> None:
    report = busy_report(run=True)
    report["run"]["counters"] = {
        "enqueued.bulk": 1_000,
        "taken_over": 300,
        "republished": 120,
        "copies_received": 1_120,
        "duplicate_deliveries.copy": 120,
    }
    text = render(report)
    assert "taken over        300   claims of a dead producer; 120 re-published" in text
    assert "broker copies    1120   delivered so far: 1000 first + 120 second copies" in text


def test_a_worker_whose_warc_writes_wait_says_why_in_both_views() -> None:
    report = busy_report(run=False)
    report["workers"][3]["problem"] = "WARC_DIR /data/warc is full (No space left on device)"
    why = "machine-3.example.com-1003 waits: WARC_DIR /data/warc is full (No space left on device)"
    assert why in render(report)
    assert why in frame(report, "footer", (200, 60))
