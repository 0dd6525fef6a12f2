"""The dashboard's connections to PostgreSQL, Redis and the management API, held across samples.

A sampler asks for its scope's figures every couple of seconds, and a run's page reads a dozen
things; opening a PostgreSQL connection, a Redis client and an HTTP connection for each of them
cost more than the queries (a PostgreSQL backend alone is a fork and an authentication). So the
process keeps them:

- PostgreSQL: a few connections in autocommit, lent one at a time (`db()`); a sample borrows
  one for all it reads and gives it back. One that broke, or that is left inside a transaction,
  is closed instead of kept, and the next borrower opens a fresh one: a database that went away
  shows in the page once and is asked again at the next tick. At most IDLE_KEPT wait idle; more
  are opened only while that many samples and pages read at the same moment.
- Redis: one client, whose own connection pool keeps a connection per thread using it at once.
- Management API: one requests.Session (keep-alive), behind CachedGet's 5 s cache.

Not psycopg_pool: its pool opens connections with psycopg.connect, where every connection here
must come from shared.postgres.db.connect (the schema's search_path, PgBouncer's transaction
mode without prepared statements, the database created on first use, errors translated).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import redis
import requests
from psycopg import pq

from ops import management
from shared.postgres import db
from shared.redis.client import GLANCE, connect_redis
from shared.settings import Settings

IDLE_KEPT = 4  # PostgreSQL connections kept open while nobody reads

Connection = psycopg.Connection[Any]
OpenDb = Callable[[], Connection]
OpenRedis = Callable[[], redis.Redis]


class Connections:
    def __init__(
        self,
        settings: Settings,
        *,
        open_db: OpenDb | None = None,
        open_redis: OpenRedis | None = None,
        session: requests.Session | None = None,
        idle_kept: int = IDLE_KEPT,
    ) -> None:
        self.settings = settings
        self._open_db = open_db or (lambda: db.connect(settings, autocommit=True))
        self._open_redis = open_redis or (lambda: connect_redis(settings, GLANCE))
        self.session = session or requests.Session()
        self._idle_kept = idle_kept
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._redis: redis.Redis | None = None
        self.db_opened = 0  # connections opened so far: what the tests and the benchmark count

    @contextlib.contextmanager
    def db(self) -> Iterator[Connection]:
        """A connection in autocommit, lent for the block; errors are translated
        (ServiceUnavailable) as db.connect's are."""
        conn = self._borrow()
        try:
            with db.translate(self.settings):
                yield conn
        finally:
            self._give_back(conn)

    @property
    def redis(self) -> redis.Redis:
        """The one Redis client (it connects at its first command, and again after a loss)."""
        with self._lock:
            if self._redis is None:
                self._redis = self._open_redis()
            return self._redis

    def management_get(self) -> management.HttpGet:
        return management.getter(self.settings, self.session)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            client, self._redis = self._redis, None
        for conn in idle:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        if client is not None:
            client.close()
        self.session.close()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def _borrow(self) -> Connection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not (conn.closed or conn.broken):
                    return conn
        with db.translate(self.settings):
            conn = self._open_db()
        with self._lock:
            self.db_opened += 1
        return conn

    def _give_back(self, conn: Connection) -> None:
        reusable = (
            not conn.closed and not conn.broken and conn.info.transaction_status == pq.TransactionStatus.IDLE
        )
        if reusable:
            with self._lock:
                if len(self._idle) < self._idle_kept:
                    self._idle.append(conn)
                    return
        with contextlib.suppress(psycopg.Error):
            conn.close()
