"""Remove everything one pipeline made under its names: queues, exchanges, Redis keys, schema.

For throwaway pipelines (tests, benchmarks) that run under names of their own. Best effort:
a part that cannot be reached is left as it is.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql

from shared import broker
from shared.keys import Keys
from shared.redis_client import OPERATOR, connect_redis
from shared.settings import Settings
from shared.topology import build_topology


def remove_pipeline(settings: Settings) -> None:
    with contextlib.suppress(Exception):
        topology = build_topology(settings)
        connection = broker.connect(settings, "teardown")
        channel = connection.channel()
        for queue in topology.queues:
            channel.queue_delete(queue.name)
        for exchange in topology.exchanges:
            channel.exchange_delete(exchange.name)
        connection.close()
    with contextlib.suppress(Exception):
        client = connect_redis(settings, OPERATOR)
        keys = list(client.scan_iter(Keys(settings.redis_prefix).all_pattern(), count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()
    with contextlib.suppress(Exception), psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.pg_schema)))
