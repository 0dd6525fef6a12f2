"""Where a URL the worker does not finish now goes, as a copy the worker publishes, the message
acked only once the copy is confirmed: a retry queue after a transient failure, a defer queue
when its domain cannot take it for longer than the worker holds a URL, its run's hold queue
while the run is paused, the dead-letter exchange after the last allowed failure or a permanent
one. The handler decides which a URL gets (worker/handler.py, and worker/handling/storing.py for a row the
database refuses); these only build the copy (an Outcome.forward, published by the shared
consumer), from the topology, the retry delays and the worker's id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from shared import metrics
from shared.amqp.broker import Publication
from shared.amqp.topology import (
    Topology,
    dead_letter_exchange,
    defer_exchange,
    delay_routing_key,
    new_task_routing_key,
    retry_exchange,
    work_exchange,
)
from shared.consumer import Outcome
from shared.errors import TaskError
from shared.message_bounds import RENDER_KIND, bounded_body
from shared.messages import CrawlTask, Failure, Progress
from shared.redis.runstate import held_exchange
from shared.settings import Settings
from shared.try_later import TryLater
from worker.handling.log import log, log_context

HOLD_UNROUTABLE_WAIT_S = 5.0  # how long a paused run's message with no hold queue waits to come back


def retry(
    topology: Topology, settings: Settings, body: bytes, task: CrawlTask, failed: Progress, exc: TaskError
) -> Outcome:
    delay_ms = topology.delay_ms_for(settings.retry_delay_s(failed.attempt))
    log.info(
        "retrying %s run=%s in %dms after attempt %d: %s",
        task.url,
        task.run_id,
        delay_ms,
        failed.attempt,
        exc,
        extra=log_context(task),
    )
    metrics.RETRIES.labels(exc.reason).inc()
    return Outcome.forward(
        Publication(
            retry_exchange(topology.namespace),
            delay_routing_key(delay_ms, task.queue),
            body,
            failed.to_headers(),
            task.priority or None,
        )
    )


def defer(topology: Topology, body: bytes, task: CrawlTask, progress: Progress, later: TryLater) -> Outcome:
    """The domain cannot take the URL for longer than we wait in-process: back through a
    defer queue, with no attempt charged. The message is acked only once its copy is confirmed."""
    delay_ms = topology.defer_delay_ms_for(later.wait_s)
    log.debug("deferring %s by %dms (%s)", task.url, delay_ms, later.reason)
    metrics.DEFERRALS.labels(later.reason).inc()
    return Outcome.forward(
        Publication(
            defer_exchange(topology.namespace),
            delay_routing_key(delay_ms, task.queue),
            body,
            progress.to_headers(),
            task.priority or None,
        )
    )


def hold_paused(topology: Topology, body: bytes, task: CrawlTask, progress: Progress) -> Outcome:
    """A paused run's URL goes, once, to the run's hold queue, where nothing consumes it
    until `resume` moves it back; acked once its copy there is confirmed."""
    log.debug("holding %s: run %s is paused", task.url, task.run_id)
    # No hold queue bound (`resume` or `cancel` took it away while this worker still saw
    # `paused`, or it was deleted): through a defer queue instead, so the message comes
    # back once the new state is seen, rather than bouncing on its work queue.
    delay_ms = topology.defer_delay_ms_for(HOLD_UNROUTABLE_WAIT_S)
    return Outcome.forward(
        Publication(
            held_exchange(topology.namespace),
            task.run_id,
            body,
            progress.to_headers(),
            task.priority or None,
            if_unroutable=Publication(
                defer_exchange(topology.namespace),
                delay_routing_key(delay_ms, task.queue),
                body,
                progress.to_headers(),
                task.priority or None,
            ),
        )
    )


def dead_letter(
    topology: Topology,
    worker_id: str,
    body: bytes,
    origin: str,
    progress: Progress,
    exc: TaskError,
    url: str = "",
) -> Outcome:
    log.warning("dead-lettering %s after %d attempts: %s", url or "<undecodable>", progress.attempt, exc)
    failure = Failure(exc.reason, exc.detail, exc.http_status, origin, worker_id)
    body, about_body = bounded_body(body)
    return Outcome.forward(
        Publication(
            dead_letter_exchange(topology.namespace),
            origin,
            body,
            {**progress.to_headers(), **failure.to_headers(), **about_body},
        )
    )


def to_render(
    topology: Topology,
    task: CrawlTask,
    progress: Progress,
    reason: str,
    count: Callable[[str, str], None] | None = None,
) -> Outcome:
    """A page only a browser can build (RENDER=auto): to the render queue as a task of kind
    `render`, its attempts so far kept; acked once the copy is confirmed, like a retry.
    `count` adds it to the run's figures (worker/render_figures.py)."""
    log.info("sending %s run=%s to be rendered (%s)", task.url, task.run_id, reason, extra=log_context(task))
    metrics.SENT_TO_RENDER.labels(reason).inc()
    if count is not None:
        count(task.run_id, reason)
    return Outcome.forward(
        Publication(
            work_exchange(topology.namespace),
            new_task_routing_key(RENDER_KIND),
            dataclasses.replace(task, queue=RENDER_KIND, priority=0).encode(),
            progress.to_headers(),
        )
    )
