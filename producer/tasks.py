"""What the producer publishes for each URL: a URL read, canonical and fingerprinted
(Candidate), and, once claimed as new, the message it goes out as, routed to its work queue
(TaskMessages).

Apart from the loop (producer/pipeline.py), which decides when URLs are claimed and published:
this is the work done once for every URL, the part of the producer that routing rules and the
task's wire format change.
"""

from __future__ import annotations

from dataclasses import dataclass

from producer.routing import Router
from producer.sitemaps import SitemapEntry
from shared.amqp.broker import Publication
from shared.amqp.topology import new_task_routing_key, work_exchange
from shared.message_bounds import TASK_KINDS
from shared.messages import TaskBodies


@dataclass(slots=True)  # not frozen: made for every URL, and frozen dataclasses build slowly
class Candidate:
    entry: SitemapEntry
    canonical: str
    fingerprint: bytes


class TaskMessages:
    """The queue kind and the publication of each new URL, for a work exchange."""

    def __init__(self, namespace: str, router: Router) -> None:
        self._router = router
        # The same for every task: made once, not per URL.
        self._exchange = work_exchange(namespace)
        self._routing_keys = {kind: new_task_routing_key(kind) for kind in TASK_KINDS}

    def for_batch(
        self, batch: list[Candidate], bodies: TaskBodies, now: float
    ) -> tuple[list[str], list[Publication]]:
        """The queue kind each URL of `batch` is routed to, and its publication, in order."""
        queues = []
        publications = []
        for candidate in batch:
            queue, publication = self._publication(candidate, bodies, now)
            queues.append(queue)
            publications.append(publication)
        return queues, publications

    def _publication(self, candidate: Candidate, bodies: TaskBodies, now: float) -> tuple[str, Publication]:
        """The queue kind `candidate` is routed to, and its message: the body a CrawlTask of it
        would encode to, made without one (the producer makes one for every URL)."""
        entry = candidate.entry
        route = self._router.route(candidate.canonical, entry.priority, entry.lastmod, now)
        queue = route.queue
        priority = route.message_priority if queue == "priority" else 0
        body = bodies.body(
            candidate.canonical,
            queue,
            priority,
            entry.lastmod,
            entry.changefreq,
            entry.priority,
            entry.source,
        )
        # No progress headers: a message without them is a URL's first attempt
        # (shared/messages.py), and RabbitMQ spends less on a message without a table.
        publication = Publication(
            self._exchange,
            self._routing_keys[queue],
            body,
            priority=priority if queue == "priority" else None,
        )
        return queue, publication
