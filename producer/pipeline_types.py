"""What the producer's loop (producer/pipeline.py) is given and what it gives back: the shapes
of the dedup store, the publisher and the earlier run it is handed (injected, so tests hand it
fakes), and the counts of a run."""

from __future__ import annotations

import collections
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shared.amqp.broker import Publication
from shared.messages import QUEUE_KINDS


class ClaimResult(Protocol):
    @property
    def is_new(self) -> list[bool]: ...
    @property
    def token(self) -> bytes: ...


class DedupStore(Protocol):
    def claim(self, fingerprints: Sequence[bytes]) -> ClaimResult: ...
    def confirm(self, fingerprints: Sequence[bytes], counters: dict[str, int] | None = None) -> None: ...
    def release(self, fingerprints: Sequence[bytes], token: bytes) -> int: ...


class PreviousFetches(Protocol):
    run_id: str

    def fetched_at(self, urls: Sequence[str]) -> dict[str, datetime.datetime]: ...


class Outcomes(Protocol):
    def wait(self) -> list[bool]: ...


class Publisher(Protocol):
    def submit(self, publications: Sequence[Publication]) -> Outcomes: ...
    def publish_batch(self, publications: Sequence[Publication]) -> list[bool]: ...


@dataclass
class Counts:
    urls_seen: int = 0
    enqueued: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUEUE_KINDS, 0))
    duplicates: int = 0
    invalid: collections.Counter[str] = field(default_factory=collections.Counter)
    publish_failed: int = 0
    stopped_early: bool = False  # a stop was requested before every input was read
    not_due: int = 0  # recrawls: unchanged since the earlier run fetched them, not published
    taken_over: int = 0  # claims of a dead producer taken over, to be published again
    republished: int = 0  # of those, published: the broker may hold an earlier copy of each
    left_claimed: int = 0  # stopped while another producer, alive, still held these URLs
    # What a broker outage cost in confirms: publishes that went unconfirmed (and were sent again),
    # and the longest the producer waited on one batch, its re-publishing included.
    unconfirmed: int = 0
    confirm_wait_max_s: float = 0.0

    @property
    def enqueued_total(self) -> int:
        return sum(self.enqueued.values())
