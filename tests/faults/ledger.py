"""The ledger of a scenario: where every published URL ended, read from PostgreSQL.

    lost        = published URLs with no outcome: not stored, not dead-lettered, not skipped
    duplicated  = URLs with more than one outcome row (a page and a dead letter, say)
    rewrites    = page rows written more than once (a redelivery: one row, `writes` > 1)

Outcomes are committed before any ack, so once the queues are empty the ledger is final.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.errors import ServiceUnavailable
from shared.postgres import db
from shared.settings import Settings

PAGES = "SELECT url, writes, failed_attempts FROM pages WHERE run_id = %s"
DEAD = (
    "SELECT url, reason, attempts, replays, worker_id FROM dead_letters"
    " WHERE (run_id = %s OR url = ANY(%s)) AND state = 'dead'"
)
SKIPS = "SELECT url FROM skips WHERE run_id = %s"
QUIET_S = 15.0


@dataclass(frozen=True)
class DeadLetter:
    reason: str
    attempts: int
    replays: int
    worker_id: str  # empty when the broker dead-lettered it (expiry, its own delivery limit)


@dataclass(frozen=True)
class Ledger:
    published: int
    stored: dict[str, int] = field(default_factory=dict)  # url -> failed attempts before success
    dead: dict[str, DeadLetter] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    rewrites: int = 0

    def assert_every_url_once(self) -> None:
        """Every published URL has an outcome, and none has two."""
        assert self.lost == [], f"{len(self.lost)} lost, e.g. {self.lost[:5]}"
        assert self.duplicated == [], f"{len(self.duplicated)} with two outcomes, e.g. {self.duplicated[:5]}"

    def dead_by_reason(self) -> dict[str, int]:
        return dict(collections.Counter(d.reason for d in self.dead.values()))

    def figures(self) -> dict[str, object]:
        return {
            "published": self.published,
            "stored": len(self.stored),
            "dead_letters": self.dead_by_reason(),
            "skipped": len(self.skipped),
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "rewrites": self.rewrites,
        }


def take_ledger(
    settings: Settings, run_id: str, published: Collection[str], other_dead: Collection[str] = ()
) -> Ledger:
    """`published`: every URL the run put in a queue. `other_dead`: dead-letter keys that carry
    no run id (undecodable bodies are stored as 'undecodable:<sha256>')."""
    with db.connect(settings, autocommit=True) as conn:
        pages = list(conn.execute(PAGES, (run_id,)))
        dead_rows = list(conn.execute(DEAD, (run_id, list(other_dead))))
        skips = {str(url) for (url,) in conn.execute(SKIPS, (run_id,))}
    stored = {str(url): int(str(failed)) for url, _writes, failed in pages}
    dead = {
        str(url): DeadLetter(str(reason), int(str(attempts)), int(str(replays)), str(worker))
        for url, reason, attempts, replays, worker in dead_rows
    }
    outcomes = collections.Counter([str(url) for url, _w, _f in pages])
    outcomes.update(str(url) for url, *_ in dead_rows)
    outcomes.update(skips)
    expected = {*published, *other_dead}
    return Ledger(
        published=len(expected),
        stored=stored,
        dead=dead,
        skipped=skips,
        lost=sorted(url for url in expected if url not in outcomes),
        duplicated=sorted(url for url, n in outcomes.items() if n > 1),
        rewrites=sum(1 for _url, writes, _f in pages if int(str(writes)) > 1),
    )


def queued_messages(settings: Settings) -> int:
    """Messages ready in any queue of the run's topology (work, delay, dead-letter)."""
    connection = broker.connect(settings, "faults-ledger")
    try:
        channel = connection.channel()
        return sum(broker.queue_depth(channel, q.name)[0] for q in build_topology(settings).queues)
    finally:
        connection.close()


def wait_for_ledger(
    settings: Settings,
    run_id: str,
    published: Collection[str],
    timeout_s: float,
    other_dead: Collection[str] = (),
    check: Callable[[], None] = lambda: None,
    drained: bool = True,
) -> Ledger:
    """Poll until every published URL has an outcome and (if `drained`) the queues are empty,
    when the ledger cannot change any more, or until `timeout_s`; return the ledger as it then
    is. `check` runs on each poll: a scenario raises from it when a process died that should not
    have."""
    deadline = time.monotonic() + timeout_s
    outcomes, changed_at = -1, time.monotonic()
    while True:
        check()
        try:
            ledger = take_ledger(settings, run_id, published, other_dead)
            empty = queued_messages(settings) == 0
            settled = not ledger.lost and (not drained or empty)
            now = len(ledger.stored) + len(ledger.dead) + len(ledger.skipped)
            if now != outcomes:
                outcomes, changed_at = now, time.monotonic()
            # Nothing queued and nothing new for a while: what is missing now will not come.
            stuck = empty and time.monotonic() - changed_at > QUIET_S
        except ServiceUnavailable:
            settled = stuck = False  # a service of the scenario is down; the ledger waits for it
        if settled or stuck or time.monotonic() > deadline:
            # Once more after a pause: a late redelivery must have nothing left to add.
            time.sleep(1.0)
            return take_ledger(settings, run_id, published, other_dead)
        time.sleep(0.5)


def wait_for_progress(
    settings: Settings, run_id: str, outcomes: int, timeout_s: float, check: Callable[[], None]
) -> None:
    """Wait until the run has `outcomes` rows (stored, dead or skipped)."""
    deadline = time.monotonic() + timeout_s
    while outcomes_so_far(settings, run_id) < outcomes:
        check()
        assert time.monotonic() < deadline, f"fewer than {outcomes} outcomes in {timeout_s} s"
        time.sleep(0.05)


def outcomes_so_far(settings: Settings, run_id: str) -> int:
    """Stored + dead + skipped rows of the run: for scheduling faults by progress."""
    query = (
        "SELECT (SELECT count(*) FROM pages WHERE run_id = %(r)s)"
        " + (SELECT count(*) FROM dead_letters WHERE run_id = %(r)s)"
        " + (SELECT count(*) FROM skips WHERE run_id = %(r)s)"
    )
    try:
        with db.connect(settings, autocommit=True) as conn:
            row = conn.execute(query, {"r": run_id}).fetchone()
    except ServiceUnavailable:
        return 0
    except Exception as exc:  # the tables do not exist until the first service has started
        if "does not exist" in str(exc):
            return 0
        raise
    return int(str(row[0])) if row else 0
