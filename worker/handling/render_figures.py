"""The run's figure of the pages a worker sent on to be rendered (RENDER=auto), by reason: a
field `sent_to_render.<reason>` of the run's counters in Redis, beside the producer's
`enqueued.render` (the URLs a routing rule sent there), as `python -m ops.run_report` shows.
A figure, not state: counted when the page is sent, before its copy is confirmed."""

from __future__ import annotations

import redis

from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys

SENT_PREFIX = "sent_to_render."


class RenderFigures:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    def sent(self, run_id: str, reason: str) -> None:
        with translate_redis_errors(self._client):
            self._client.hincrby(self._keys.run_stats(run_id), f"{SENT_PREFIX}{reason}", 1)
