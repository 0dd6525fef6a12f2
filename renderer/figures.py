"""The run's figures of its renders, in the run's counters in Redis beside the worker's
`sent_to_render.<reason>` (worker/handling/render_figures.py) and the producer's
`enqueued.render`:

    renders.<outcome>   one per render made for a task of the run, each attempt counted:
                        ok (settled), unsettled (read at the deadline), render_timeout,
                        render_crashed, render_refused, or the reason the worker's own
                        judgement gave the document's answer (http_404, ...)
    render_ms           the wall-clock milliseconds of those renders, summed

Figures, not state: counted as each render ends, whatever then becomes of its row.

The Fetch a handler calls is given a URL, not a task, so the run a render is for is known per
handler thread: `RunsInHand` notes it around each handling (one thread handles one delivery at
a time, and its fetch runs on that thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis

from shared.consumer import Delivery, Outcome
from shared.errors import DecodeError
from shared.messages import CrawlTask
from shared.redis.deferred_writes import write_later
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys

RENDERS_PREFIX = "renders."
RENDER_MS_FIELD = "render_ms"

Handler = Callable[[Delivery], Outcome]


class RunRenderFigures:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    def rendered(self, run_id: str, outcome: str, render_ms: int) -> None:
        # Writes nobody waits for: they ride with the thread's next command (the row's, the
        # lease's release), as the worker's cache writes do (shared/redis/deferred_writes.py).
        stats = self._keys.run_stats(run_id)
        with translate_redis_errors(self._client):
            write_later(self._client, "HINCRBY", stats, f"{RENDERS_PREFIX}{outcome}", 1)
            write_later(self._client, "HINCRBY", stats, RENDER_MS_FIELD, render_ms)


class RunsInHand:
    """The run of the delivery each handler thread is handling."""

    def __init__(self) -> None:
        self._local = threading.local()

    def around(self, handler: Handler) -> Handler:
        def handle(delivery: Delivery) -> Outcome:
            try:
                self._local.run_id = CrawlTask.decode(delivery.body).run_id
            except DecodeError:
                self._local.run_id = None  # the handler dead-letters it without a render
            try:
                return handler(delivery)
            finally:
                self._local.run_id = None

        return handle

    def current(self) -> str | None:
        run_id: str | None = getattr(self._local, "run_id", None)
        return run_id


def counted_by_run(runs: RunsInHand, figures: RunRenderFigures) -> Callable[[str, int], None]:
    """RenderFetch's `count`: a render's outcome and time, added to the figures of the run in hand."""

    def count(outcome: str, render_ms: int) -> None:
        if (run_id := runs.current()) is not None:
            figures.rendered(run_id, outcome, render_ms)

    return count
