"""A discovery run's options in PostgreSQL, the copy that outlives Redis.

The producer keeps a run's options in Redis for the frontier (producer/frontier_redis.py), and
here as well, before it publishes anything of the run. Redis without persistence comes back
empty after a restart; a frontier that then finds no options in Redis reads them here and puts
them back, instead of taking the run for one that does not discover and cutting all its links.
"""

from __future__ import annotations

from producer.discovery_scope import DiscoveryOptions
from shared.postgres import db
from shared.settings import Settings

UPSERT = (
    "INSERT INTO run_discovery (run_id, options) VALUES (%s, %s)"
    " ON CONFLICT (run_id) DO UPDATE SET options = EXCLUDED.options"
)
SELECT = "SELECT options FROM run_discovery WHERE run_id = %s"


def store_options(settings: Settings, run_id: str, options: DiscoveryOptions) -> None:
    db.ensure_schema(settings)  # the producer may be the run's first process to reach PostgreSQL
    with db.translate(settings), db.connect(settings, autocommit=True) as conn:
        conn.execute(UPSERT, (run_id, options.encode()))


def stored_options(settings: Settings, run_id: str) -> DiscoveryOptions | None:
    with db.translate(settings), db.connect(settings, autocommit=True) as conn:
        row = conn.execute(SELECT, (run_id,)).fetchone()
    if row is None or not isinstance(row[0], bytes | memoryview):
        return None
    return DiscoveryOptions.decode(bytes(row[0]))
