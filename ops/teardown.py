"""Remove everything one pipeline made under its names: queues, exchanges, Redis keys, schema.

For throwaway pipelines (tests, benchmarks) that run under names of their own. Best effort:
a part that cannot be reached is left as it is.

The runs' hold queues (`<ns>.held.<run>`, declared by `python -m ops.runs pause`) are not in the
topology, and AMQP cannot list queues: they are found from the runs Redis has keys for (before
those keys go), and from the management API's list when it answers.
"""

from __future__ import annotations

import contextlib

import psycopg
import redis
from psycopg import sql

from ops import management
from shared.amqp import broker
from shared.amqp.topology import HELD, build_topology, queue_role
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import held_queue
from shared.settings import Settings


def remove_pipeline(settings: Settings) -> None:
    keys = Keys(settings.redis_prefix)
    runs: set[str] = set()
    with contextlib.suppress(Exception):
        client = connect_redis(settings, OPERATOR)
        runs = known_runs(client, keys)
        client.close()
    with contextlib.suppress(Exception):
        topology = build_topology(settings)
        connection = broker.connect(settings, "teardown")
        channel = connection.channel()
        for queue in [*(queue.name for queue in topology.queues), *hold_queues(settings, runs)]:
            channel.queue_delete(queue)
        for exchange in topology.exchanges:
            channel.exchange_delete(exchange.name)
        connection.close()
    with contextlib.suppress(Exception):
        client = connect_redis(settings, OPERATOR)
        found = list(client.scan_iter(keys.all_pattern(), count=1000))
        for start in range(0, len(found), 500):
            client.delete(*found[start : start + 500])
        client.close()
    with contextlib.suppress(Exception), psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.pg_schema)))


def known_runs(client: redis.Redis, keys: Keys) -> set[str]:
    """The runs with counters or a state (a paused run may have only that) under the prefix."""
    runs = set()
    for key_of in (keys.run_stats, keys.run_state):
        prefix, suffix = key_of("\0").split("\0")
        runs |= {key.decode()[len(prefix) : -len(suffix)] for key in client.scan_iter(f"{prefix}*{suffix}")}
    return runs


def hold_queues(settings: Settings, runs: set[str]) -> list[str]:
    """The hold queues of these runs, and every other hold queue of the namespace the management
    API lists (when it answers)."""
    ns = settings.crawl_namespace
    names = {held_queue(ns, run) for run in runs}
    listed = management.list_queues(settings, management.getter(settings)) or []
    names |= {queue["name"] for queue in listed if queue_role(ns, queue["name"]) == HELD}
    return sorted(names)
