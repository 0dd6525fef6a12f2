"""Which workers are running now: each keeps a short-lived key in Redis while it runs.

A worker refreshes `<prefix>:worker:<worker id>` every HEARTBEAT_S with a time to live of
PRESENCE_TTL_S, and deletes it when it stops cleanly. `status` lists the keys it finds, so a
stopped worker leaves the list at once, and one that died without stopping (SIGKILL, a lost
machine) within PRESENCE_TTL_S. Pages stored say nothing of an idle or rate-limited worker,
which is why liveness is not read from PostgreSQL.

The heartbeat runs on a thread of its own with its own connection, so a busy worker still
beats; a Redis outage only skips beats (the worker pauses for Redis anyway).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from shared.redis.client import GLANCE, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings

log = logging.getLogger("shared.presence")  # the name operators know: kept as the module moved

# A beat wakes a thread and makes a Redis round trip. A worker with nothing to do spent half to
# two thirds of its CPU on them at one beat every 5 s, and a slow, polite crawl keeps its
# workers waiting most of the time. The price of a rarer beat: a worker killed without stopping
# stays listed longer; a clean stop still deletes its key at once.
HEARTBEAT_S = 15.0
PRESENCE_TTL_S = 45.0  # three missed beats and the worker is gone


def presence_record(
    worker_id: str, started_at: float, problem: str | None = None, figures: dict[str, Any] | None = None
) -> str:
    record: dict[str, Any] = {
        **(figures or {}),
        "worker_id": worker_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": started_at,
    }
    if problem is not None:  # why the worker's work waits (a full WARC_DIR), for status to show
        record["problem"] = problem
    return json.dumps(record)


@contextlib.contextmanager
def announced(
    settings: Settings,
    heartbeat_s: float = HEARTBEAT_S,
    ttl_s: float = PRESENCE_TTL_S,
    problem: Callable[[], str | None] = lambda: None,
    figures: Callable[[], dict[str, Any]] = dict,
) -> Iterator[None]:
    """Keep this worker's presence key alive while the block runs; remove it on the way out.
    Each beat carries `problem()`, what holds the worker's work up now, if anything, and
    `figures()`, what the process reports of itself (a renderer's browser restarts)."""
    client = connect_redis(settings, GLANCE)
    key = Keys(settings.redis_prefix).worker(settings.worker_id)
    started_at = time.time()
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                record = presence_record(settings.worker_id, started_at, problem(), figures())
                client.set(key, record, px=round(ttl_s * 1000))
            except redis.RedisError as exc:
                log.debug("presence heartbeat of %s skipped: %s", settings.worker_id, exc)
            if stop.wait(heartbeat_s):
                return

    thread = threading.Thread(target=beat, name="presence", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=GLANCE.command_timeout_s * 2)
        with contextlib.suppress(redis.RedisError):
            client.delete(key)
        client.close()


def live_workers(client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    """The presence records under `prefix`, by worker id."""
    keys = sorted(client.scan_iter(match=Keys(prefix).worker_pattern(), count=1000))
    if not keys:
        return []
    found: list[dict[str, Any]] = []
    for raw in client.mget(keys):
        if raw is None:  # expired between the scan and the read
            continue
        with contextlib.suppress(ValueError, TypeError):
            record = json.loads(raw)
            if isinstance(record, dict) and isinstance(record.get("worker_id"), str):
                found.append(record)
    return sorted(found, key=lambda r: str(r["worker_id"]))
