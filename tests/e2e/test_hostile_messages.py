"""Hostile messages on the real pipeline: generated bodies and headers published to the real
queues beside normal URLs of a local site, one worker and one dead-letter consumer running.

Every distinct input must end in exactly one countable place (a stored page, a dead letter or a
skip) within a bounded time, the normal URLs must be stored, and the worker must stay up and
keep storing. What a message's place is keyed on: its (run id, URL) when its body is a valid
task, else the sha256 of its body ('undecodable:<sha256>', as the dead-letter store keys it).
"""

from __future__ import annotations

import collections
import decimal
import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ops.crawl import Processes
from shared.amqp import broker
from shared.amqp.topology import (
    build_topology,
    dead_letter_exchange,
    dead_letter_queue,
    new_task_routing_key,
    parked_queue,
    work_exchange,
    work_queue,
)
from shared.errors import DecodeError
from shared.messages import (
    ATTEMPT_HEADER,
    ERROR_HEADER,
    FIRST_FAILURE_HEADER,
    REASON_HEADER,
    REPLAY_HEADER,
    STATUS_HEADER,
    CrawlTask,
)
from shared.postgres import db
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.faults.site import FaultSite, SiteShape

pytestmark = pytest.mark.timeout(600)

RUN = "hostile"
EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "20"))  # more: a longer search
NORMAL_PER_BATCH = 4
SETTLE_S = 40.0  # a batch's every input must be accounted for within this
BAD_ATTEMPTS = [10**18, -1000, -1, 1001, "2", True, decimal.Decimal("2.5"), b"1"]
TASK_FIELDS = ["url", "run_id", "queue", "priority", "lastmod", "changefreq", "sitemap_priority", "source"]
TASK_FIELDS += ["enqueued_at", "recrawl_of"]


@dataclass(frozen=True, repr=False)
class Message:
    to_dead_letters: bool  # published straight to the dead-letter exchange
    body: bytes
    headers: dict[str, Any]
    normal: bool = False  # a valid task for a page of the site, with no headers

    def key(self) -> tuple[str, str]:
        """Where its outcome is recorded."""
        try:
            task = CrawlTask.decode(self.body)
        except DecodeError:
            return ("", f"undecodable:{hashlib.sha256(self.body).hexdigest()}")
        return (task.run_id, task.url)

    def __repr__(self) -> str:
        body = f"{self.body[:80]!r}… ({len(self.body)} bytes)"
        return f"Message({self.to_dead_letters}, {body}, {str(self.headers)[:80]})"

    def routing_key(self) -> str:
        """A valid task goes to the queue it names; anything else to bulk."""
        try:
            return new_task_routing_key(CrawlTask.decode(self.body).queue)
        except DecodeError:
            return new_task_routing_key("bulk")


# --- what hostile messages are made of -------------------------------------------------------

odd_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(),
    st.text(max_size=60).filter(lambda text: not text.lower().startswith("http")),  # never a real URL
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.sampled_from(["r" * 1_000_000, "x" * 70_000, "\x00", "\ud800", "../../etc/passwd"]),
)
bad_headers = st.one_of(
    st.builds(lambda value: {ATTEMPT_HEADER: value}, st.sampled_from(BAD_ATTEMPTS)),
    st.builds(lambda value: {REPLAY_HEADER: value}, st.sampled_from(BAD_ATTEMPTS)),
    st.builds(lambda value: {FIRST_FAILURE_HEADER: value}, st.sampled_from([-5, 10**18, "soon", True])),
    st.just({"x-death": "not a list", "crawl-attempt": 1}),
)
dead_letter_headers: st.SearchStrategy[dict[str, object]] = st.one_of(
    st.just({}),
    # Headers must fit in one AMQP frame (128 KiB here): the broker refuses larger ones itself.
    st.just({REASON_HEADER: "r" * 20_000, ERROR_HEADER: "e" * 100_000, STATUS_HEADER: 10**18}),
    st.just({REASON_HEADER: b"\xff\xfe", ATTEMPT_HEADER: 10**18, REPLAY_HEADER: -1000}),
    st.just({"x-death": [{"reason": "expired", "queue": "q" * 10_000, "count": 10**18}] * 10}),
)
junk_bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"", b"null", b"[]", b"42", b'"a"', b"{", b"[" * 20_000, b"\xff" * 2_000_000]),
    st.builds(lambda value: json.dumps(value).encode(), odd_values),
)


class Batch:
    """Messages for one example: valid tasks get site URLs of their own, so no two collide."""

    def __init__(self, site: FaultSite, counter: Iterator[int]) -> None:
        self.site = site
        self.counter = counter

    def task(self, queue: str = "bulk") -> dict[str, Any]:
        n = next(self.counter)
        return CrawlTask(self.site.url(f"/pages/{n}.html"), RUN, queue, source="hostile-test").__dict__.copy()

    def normal(self) -> Message:
        return Message(False, json.dumps(self.task()).encode(), {}, normal=True)

    def issue_cases(self) -> list[tuple[Message, str]]:
        """The attacks the issue reported, each with the dead letter it must now end as."""
        huge_run_id = json.dumps({**self.task(), "run_id": "r" * 1_000_000}).encode()
        return [
            (Message(False, huge_run_id, {}), "invalid_message"),
            (Message(False, json.dumps(self.task()).encode(), {ATTEMPT_HEADER: 10**18}), "invalid_message"),
            (Message(False, json.dumps(self.task()).encode(), {ATTEMPT_HEADER: -1000}), "invalid_message"),
            (Message(True, json.dumps(self.task()).encode(), {ATTEMPT_HEADER: 10**18}), "unknown"),
            (Message(False, b"\xff" * 5_000_000, {}), "invalid_message"),
        ]


def messages(batch: Batch) -> st.SearchStrategy[Message]:
    mutated = st.builds(
        lambda field, value, queue: Message(
            False, json.dumps({**batch.task(queue), field: value}).encode(), {}
        ),
        st.sampled_from(TASK_FIELDS),
        odd_values,
        st.sampled_from(["priority", "ttl", "bulk"]),
    )
    missing = st.builds(
        lambda field: Message(
            False, json.dumps({k: v for k, v in batch.task().items() if k != field}).encode(), {}
        ),
        st.sampled_from(TASK_FIELDS),
    )
    with_bad_headers = st.builds(
        lambda headers: Message(False, json.dumps(batch.task()).encode(), headers), bad_headers
    )
    junk = st.builds(lambda body: Message(False, body, {}), junk_bodies)
    straight_to_dead = st.builds(
        lambda body, headers: Message(True, body, headers),
        st.one_of(junk_bodies, st.builds(lambda: json.dumps(batch.task()).encode())),
        dead_letter_headers,
    )
    return st.one_of(mutated, missing, with_bad_headers, junk, straight_to_dead)


# --- the pipeline -----------------------------------------------------------------------------


@pytest.fixture
def site() -> Iterator[FaultSite]:
    with FaultSite(SiteShape(pages=10_000)) as running:
        yield running


def publish_all(settings: Settings, batch: list[Message]) -> None:
    ns = settings.crawl_namespace
    connection = broker.connect(settings, "hostile-publisher")
    try:
        channel = broker.confirm_channel(connection)
        for message in batch:
            if message.to_dead_letters:
                publication = broker.Publication(dead_letter_exchange(ns), "", message.body, message.headers)
            else:
                publication = broker.Publication(
                    work_exchange(ns), message.routing_key(), message.body, message.headers
                )
            broker.publish(channel, publication)
    finally:
        connection.close()


def places(settings: Settings) -> dict[tuple[str, str], list[str]]:
    """Every place each key ended in, so far ('page', 'dead:<reason>', 'skip:<reason>')."""
    found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    with db.connect(settings, autocommit=True) as conn:
        for run_id, url in conn.execute("SELECT run_id, url FROM pages"):
            found[(str(run_id), str(url))].append("page")
        for run_id, url, reason in conn.execute(
            "SELECT run_id, url, reason FROM dead_letters WHERE state = 'dead'"
        ):
            found[(str(run_id), str(url))].append(f"dead:{reason}")
        for run_id, url, reason in conn.execute("SELECT run_id, url, reason FROM skips"):
            found[(str(run_id), str(url))].append(f"skip:{reason}")
    return found


def queues_empty(settings: Settings) -> bool:
    ns = settings.crawl_namespace
    connection = broker.connect(settings, "hostile-depth")
    try:
        channel = connection.channel()
        names = [*(work_queue(ns, kind) for kind in ("priority", "ttl", "bulk")), dead_letter_queue(ns)]
        return all(broker.queue_depth(channel, name)[0] == 0 for name in names)
    finally:
        connection.close()


def test_hostile_messages_each_end_in_one_place_and_normal_urls_are_stored(
    settings: Settings, site: FaultSite, tmp_path: Path
) -> None:
    connection = broker.connect(settings, "hostile-setup")
    broker.declare_topology(connection, build_topology(settings))
    connection.close()
    procs = Processes(tmp_path, service_env(settings, FETCH_CONCURRENCY="4"))
    counter = itertools.count(1)
    batch_maker = Batch(site, counter)
    seen: set[tuple[str, str]] = set()
    normal_keys: set[tuple[str, str]] = set()
    inputs = collections.Counter[str]()
    settle_times: list[float] = []
    issue_cases = batch_maker.issue_cases()

    @hypothesis_settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],  # no shrinking: each example costs a real crawl
    )
    @given(st.lists(messages(batch_maker), min_size=10, max_size=20))
    def one_batch(hostile: list[Message]) -> None:
        batch = hostile + [batch_maker.normal() for _ in range(NORMAL_PER_BATCH)]
        if not inputs:  # the first batch carries the issue's own cases too
            batch += [message for message, _ in issue_cases]
            inputs["issue"] += len(issue_cases)
        inputs["hostile"] += len(hostile)
        inputs["normal"] += NORMAL_PER_BATCH
        seen.update(message.key() for message in batch)
        normal_keys.update(message.key() for message in batch if message.normal)
        started = time.monotonic()
        publish_all(settings, batch)
        deadline = started + SETTLE_S
        while True:
            procs.check_alive()
            found = places(settings)
            if all(found.get(key) for key in seen) and queues_empty(settings):
                break
            assert time.monotonic() < deadline, f"not settled: {[k for k in seen if not found.get(k)][:5]}"
            time.sleep(0.3)
        settle_times.append(time.monotonic() - started)

    try:
        procs.start("worker", "worker")
        procs.start("dlq_consumer", "dlq_consumer")
        one_batch()
        found = places(settings)
    finally:
        codes = procs.stop_all()

    outcomes = collections.Counter(place for ended in found.values() for place in ended)
    print(
        f"\nhostile messages: {inputs['hostile']} generated + {inputs['issue']} from the issue + "
        f"{inputs['normal']} normal inputs "
        f"in {EXAMPLES} batches, "
        f"{len(seen)} distinct keys; outcomes {dict(sorted(outcomes.items()))}; "
        f"slowest batch settled in {max(settle_times):.1f} s; exit codes {codes}"
    )
    assert all(len(found.get(key, [])) == 1 for key in seen), {k: v for k, v in found.items() if len(v) != 1}
    assert set(found) == seen  # nothing recorded that was not sent
    assert all(found[key] == ["page"] for key in normal_keys)
    assert [found[message.key()] for message, _ in issue_cases] == [[f"dead:{r}"] for _, r in issue_cases]
    connection = broker.connect(settings, "hostile-parked")
    assert broker.queue_depth(connection.channel(), parked_queue(settings.crawl_namespace))[0] == 0
    connection.close()
    assert codes == {"worker": 0, "dlq_consumer": 0}
