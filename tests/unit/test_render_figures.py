"""A renderer's figures of the run: each render's outcome and milliseconds, added to the run of
the delivery its handler thread is handling (renderer/figures.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ops.run_report import renders_line
from renderer.engine import RenderFetch
from renderer.figures import RENDER_MS_FIELD, RunRenderFigures, RunsInHand, counted_by_run
from renderer.page import Rendered, RenderTimeout
from shared.consumer import Delivery, Outcome
from shared.messages import CrawlTask
from shared.redis.keys import Keys
from worker.politeness.robots import RobotsAnswer

pytestmark = pytest.mark.unit


class FakeRedis:
    """What write_later sends to a plain client: execute_command, kept in order."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *command: Any) -> None:
        self.commands.append(command)


class FakeEngine:
    def __init__(self, settled: bool = True, fails: bool = False) -> None:
        self.settled = settled
        self.fails = fails

    def render(self, url: str) -> Rendered:
        if self.fails:
            raise RenderTimeout("no answer")
        return Rendered(url, 200, "<p>built</p>", self.settled, 120, 0)


def no_robots(url: str) -> RobotsAnswer:
    raise AssertionError("not asked")


def delivery_of(run_id: str) -> Delivery:
    body = CrawlTask(url="http://127.0.0.5/a", run_id=run_id, queue="render").encode()
    return Delivery("t.render", body, {}, False)


def test_each_render_is_counted_for_the_run_in_hand() -> None:
    client = FakeRedis()
    runs = RunsInHand()
    figures = RunRenderFigures(client, Keys("t"))  # type: ignore[arg-type]
    engines = {"r1": FakeEngine(), "r2": FakeEngine(settled=False), "r3": FakeEngine(fails=True)}

    def handler(delivery: Delivery) -> Outcome:
        run_id = CrawlTask.decode(delivery.body).run_id
        fetch = RenderFetch(engines[run_id], no_robots, counted_by_run(runs, figures))
        try:
            fetch.page("http://127.0.0.5/a", None)
        except RenderTimeout:
            return Outcome.reject(requeue=False)
        return Outcome.done()

    handle = runs.around(handler)
    for run_id in ("r1", "r2", "r3"):
        handle(delivery_of(run_id))
    fields = [(command[1], command[2]) for command in client.commands if command[0] == "HINCRBY"]
    assert fields[0::2] == [
        ("t:run:r1:stats", "renders.ok"),
        ("t:run:r2:stats", "renders.unsettled"),
        ("t:run:r3:stats", "renders.render_timeout"),
    ]
    assert [field for _, field in fields[1::2]] == [RENDER_MS_FIELD] * 3
    assert all(command[3] == 1 for command in client.commands[0::2])
    assert runs.current() is None  # nothing in hand once the handling is over


def test_the_run_in_hand_is_the_threads_own() -> None:
    runs = RunsInHand()
    seen: dict[str, str | None] = {}
    inside = threading.Barrier(2)

    def handler(delivery: Delivery) -> Outcome:
        inside.wait(timeout=5)  # both threads hold a delivery at once
        seen[CrawlTask.decode(delivery.body).run_id] = runs.current()
        return Outcome.done()

    handle = runs.around(handler)
    threads = [threading.Thread(target=handle, args=(delivery_of(run),)) for run in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)
    assert seen == {"a": "a", "b": "b"}


def test_a_body_that_is_no_task_is_handled_with_no_run_in_hand() -> None:
    runs = RunsInHand()
    seen: list[str | None] = []

    def handler(delivery: Delivery) -> Outcome:
        seen.append(runs.current())
        return Outcome.done()

    runs.around(handler)(Delivery("t.render", b"not json", {}, False))
    assert seen == [None]


def test_the_run_report_shows_the_renders_by_outcome_and_their_mean_time() -> None:
    counters = {"renders.ok": 3, "renders.render_timeout": 1, "renders.unsettled": 0, RENDER_MS_FIELD: 6000}
    assert renders_line(counters) == (
        "\n  renders                4   (ok 3, render timeout 1; 1500 ms each on average)"
    )
    assert renders_line({"enqueued.bulk": 5}) == ""
