"""/readyz's checks of the three services, and the figures of the seed's /stats."""

from __future__ import annotations

import contextlib
from typing import Any

import pika
import psycopg
import redis

from ops import management
from ops.dashboard import data
from ops.dashboard.connections import Connections
from ops.status import gather
from shared.settings import Settings, amqp_urls

CHECK_TIMEOUT_S = 1.0


def unready(settings: Settings) -> list[str]:
    """The services that did not answer within about a second: names only, never why (the
    endpoint answers without auth)."""
    failed = []
    try:
        with psycopg.connect(settings.database_url, connect_timeout=int(CHECK_TIMEOUT_S) or 1) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        failed.append("postgresql")
    client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=CHECK_TIMEOUT_S, socket_connect_timeout=CHECK_TIMEOUT_S
    )
    try:
        client.ping()
    except redis.RedisError:
        failed.append("redis")
    finally:
        client.close()
    parameters = pika.URLParameters(amqp_urls(settings.amqp_url)[0])
    parameters.connection_attempts = 1
    parameters.socket_timeout = CHECK_TIMEOUT_S
    parameters.stack_timeout = 2 * CHECK_TIMEOUT_S
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.AMQPError:
        failed.append("rabbitmq")
    else:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()
    return failed


def seed_stats(
    links: Connections, run_id: str | None, get: management.HttpGet | None = None
) -> dict[str, Any]:
    """{"workers": n, "tasks": {enqueued, stored, dead, skipped, left, queued}, "throughput":
    {pages_per_s, window_s}}: one run's, or the sum of the latest runs' (data.RUNS_LIMIT)."""
    with links.db() as conn:
        report = gather(links.settings, None, get, conn=conn, client=links.redis)
    if run_id is not None:
        run = data.run_detail(links, run_id, get)
        totals = {k: run[k] for k in ("enqueued", "stored", "dead", "skipped", "left")}
    else:
        rows = data.runs_page(links)
        totals = {k: sum(r[k] for r in rows) for k in ("enqueued", "stored", "dead", "skipped", "left")}
    activity = report["activity"] or {"pages_per_s": 0.0, "window_s": 60}
    return {
        "workers": len(report["workers"] or []),
        "tasks": {**totals, "queued": data.work_queued(report["queues"])},
        "throughput": {"pages_per_s": activity["pages_per_s"], "window_s": activity["window_s"]},
    }
