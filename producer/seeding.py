"""A run seeded once: `python -m producer --once --run-id ID` publishes a run's URLs the first
time and does nothing on every later start.

Compose starts a finished producer container again on every `up` (`--scale worker=6`, say). With
a fixed run id, dedup already keeps such a start from publishing a URL twice, but it would read
every sitemap again and count every URL again as a duplicate. Once a run's producer has read
everything and exited 0, its summary is kept in Redis, beside the run's dedup state, and a later
`--once` start prints that summary and exits 0 without reading anything. A run that failed or
was stopped early leaves no mark, so the next start resumes it.

The mark lives as long as the dedup state it describes: forget one (`redis-cli del`, or a new
Redis volume) and the other goes with it, or the run would be seeded again from scratch.
"""

from __future__ import annotations

import json
import time
from typing import Any

from shared.redis.client import PRODUCER, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings


def seeded_summary(settings: Settings, run_id: str) -> dict[str, Any] | None:
    """The summary a completed seeding of `run_id` left, or None when it has not completed."""
    client = connect_redis(settings, PRODUCER, ping=True)
    try:
        with translate_redis_errors(settings.redis_url):
            raw = client.get(Keys(settings.redis_prefix).run_seeded(run_id))
    finally:
        client.close()
    if raw is None:
        return None
    found: dict[str, Any] = json.loads(raw)
    return found


def mark_seeded(settings: Settings, run_id: str, summary: dict[str, Any]) -> None:
    record = {**summary, "seeded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    client = connect_redis(settings, PRODUCER, ping=True)
    try:
        with translate_redis_errors(settings.redis_url):
            client.set(Keys(settings.redis_prefix).run_seeded(run_id), json.dumps(record))
    finally:
        client.close()
