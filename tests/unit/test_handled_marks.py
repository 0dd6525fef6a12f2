"""worker.handling.handled.HandledMarks with a fake Redis client: close() is final."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import cast

import redis

from shared.messages import CrawlTask
from shared.redis.keys import Keys
from worker.handling.handled import HandledMarks


class FakePipeline:
    def __init__(self, written: list[tuple[str, bytes]]) -> None:
        self.written = written
        self.queued: list[tuple[str, bytes]] = []

    def hset(self, key: str, field: bytes, value: bytes) -> None:
        self.queued.append((key, field))

    def execute(self) -> None:
        self.written.extend(self.queued)

    def __enter__(self) -> FakePipeline:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        pass


class FakeRedis:
    def __init__(self) -> None:
        self.written: list[tuple[str, bytes]] = []

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self.written)

    def register_script(self, script: str) -> object:
        return None  # never called here


def writers() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "handled-marks" and t.is_alive())


def test_marks_before_close_are_sent_and_a_mark_after_it_is_dropped_without_a_new_writer() -> None:
    client = FakeRedis()
    marks = HandledMarks(cast(redis.Redis, client), Keys("t-handled"))
    before = writers()
    marks.mark_later(CrawlTask(url="http://a.test/1", run_id="r1", queue="bulk"))
    marks.close()
    assert len(client.written) == 1

    marks.mark_later(CrawlTask(url="http://a.test/2", run_id="r1", queue="bulk"))
    assert writers() == before  # no writer started after close()
    marks.close()
    assert len(client.written) == 1
