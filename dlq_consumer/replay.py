"""Replay: send dead letters back to the work queue they came from, as fresh attempts.

Each row is published, confirmed by the broker, and only then marked 'replayed', one row per
transaction. A crash in between leaves the row 'dead', so the worst case is one URL fetched twice
(which every consumer tolerates), never a URL marked replayed that the broker does not hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord
from shared.amqp.broker import Publication
from shared.amqp.topology import new_task_routing_key, work_exchange
from shared.errors import DecodeError
from shared.messages import CrawlTask, Progress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayResult:
    replayed: int
    skipped: int  # rows whose body is not a task: there is no queue to send them to


def replay_publication(row: DeadLetterRecord, namespace: str) -> Publication | None:
    """The message that gives this URL a fresh set of attempts; None if its body is not a task."""
    try:
        task = CrawlTask.decode(row.body)
    except DecodeError:
        return None
    # Attempts start again from zero; the replay count goes up so the URL's history survives.
    progress = Progress(attempt=0, replays=row.replays + 1)
    return Publication(
        exchange=work_exchange(namespace),
        routing_key=new_task_routing_key(task.queue),
        body=row.body,
        headers=progress.to_headers(),
        priority=task.priority if task.queue == "priority" else None,
    )


def replay(
    conn: store.Connection,
    publish: Callable[[Publication], None],
    selection: store.Selection,
    namespace: str,
) -> ReplayResult:
    """Replay the selected dead rows. `publish` must return only once the broker has confirmed;
    if it raises, the current row stays 'dead' and the error propagates."""
    replayed = skipped = 0
    after_id = 0
    while selection.limit is None or replayed < selection.limit:
        with conn.transaction():
            row = store.lock_next_dead(conn, selection, after_id)
            if row is None:
                break
            after_id = row.id
            publication = replay_publication(row, namespace)
            if publication is None:
                log.warning("not replaying dead letter %d (%s): its body is not a task", row.id, row.url)
                skipped += 1
                continue
            publish(publication)
            store.mark_replayed(conn, row.id)
        replayed += 1
        log.info("replayed %s to %s (replay %d)", row.url, publication.routing_key, row.replays + 1)
    return ReplayResult(replayed, skipped)
