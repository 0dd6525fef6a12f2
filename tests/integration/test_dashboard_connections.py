"""The sampler reuses its connections: many samples of a run's page, of the overview and of the
workers' page open one PostgreSQL connection, one Redis connection and one HTTP connection to
the management API, where each sample used to open several of each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
import requests

from ops import management
from ops.dashboard.config import DashboardSettings
from ops.dashboard.connections import Connections
from ops.dashboard.context import Dashboard
from ops.dashboard.events import producer
from ops.dashboard.regions import Views
from ops.dashboard.sampler import Sampler
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from tests.fakes import FakeTime

pytestmark = pytest.mark.integration

RUN = "pooled-run"
TICKS = 20


class CountingPool(redis.ConnectionPool):
    """A Redis connection pool that counts the connections it made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made = 0

    def make_connection(self) -> Any:
        self.made += 1
        return super().make_connection()


def counting_redis(settings: Settings) -> tuple[Callable[[], redis.Redis], list[CountingPool]]:
    pools: list[CountingPool] = []

    def open_redis() -> redis.Redis:
        pools.append(CountingPool.from_url(settings.redis_url))
        return redis.Redis(connection_pool=pools[-1])

    return open_redis, pools


def seed(settings: Settings) -> None:
    db.ensure_schema(settings)
    client = connect_redis(settings, OPERATOR)
    client.hset(Keys(settings.redis_prefix).run_stats(RUN), mapping={"enqueued.bulk": 3})
    client.close()
    with db.connect(settings) as conn:
        conn.execute(
            "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id) "
            "VALUES (%s, 'https://a.example/', 'https://a.example/', 200, 'bulk', 'w1')",
            (RUN,),
        )
        conn.commit()


def sample_many(dash: Dashboard, kind: str, arg: Any) -> int:
    """TICKS samples of the view, one after another, as its live stream takes them (the
    sampler's own loop is not started: its samples would overlap these); the errors among them."""
    sampler = Sampler(f"{kind}:{arg}", producer(dash, kind, arg, acting=True), 0.0, lambda _scope: None)

    async def ticks() -> int:
        errors = 0
        for _ in range(TICKS):
            sample = await sampler.sample_once()
            errors += sample.error is not None
        return errors

    errors = asyncio.run(ticks())
    assert sampler.samples == TICKS
    return errors


def test_many_samples_open_one_connection_to_each_service(
    settings: Settings, management_api: management.HttpGet
) -> None:
    seed(settings)
    open_redis, pools = counting_redis(settings)
    session = requests.Session()
    opened_db: list[int] = []

    def open_db() -> Any:
        conn = db.connect(settings, autocommit=True)
        opened_db.append(conn.info.backend_pid)
        return conn

    links = Connections(settings, open_db=open_db, open_redis=open_redis, session=session)
    clock = FakeTime()

    def ten_seconds_later() -> float:
        clock.sleep(10)
        return clock.now

    # Each answer of the management API is kept 5 s: a clock that moves 10 s a call makes every
    # sample ask it again, over the same HTTP connection.
    views = Views(settings, DashboardSettings(), links=links, clock=ten_seconds_later)
    try:
        dash = Dashboard.build(settings, DashboardSettings(), views)
        for kind, arg in (("run", RUN), ("overview", None), ("workers", None)):
            assert sample_many(dash, kind, arg) == 0, kind
        adapter = session.get_adapter(settings.rabbitmq_management_url)
        assert isinstance(adapter, requests.adapters.HTTPAdapter)
        manager = adapter.poolmanager
        # One host, the management API (urllib3's container has keys() but cannot be iterated).
        (http,) = [manager.pools[key] for key in manager.pools.keys()]  # noqa: SIM118
        assert len(opened_db) == 1, f"{len(opened_db)} PostgreSQL connections over {3 * TICKS} samples"
        made = [pool.made for pool in pools]
        assert made == [1], f"Redis clients and their connections over {3 * TICKS} samples: {made}"
        assert http.num_connections == 1, f"{http.num_connections} HTTP connections"
        assert http.num_requests >= 3 * TICKS  # every sample did ask the management API
        with links.db() as conn:
            assert conn.info.backend_pid == opened_db[0]  # the same server session all along
    finally:
        links.close()


def test_without_keeping_them_each_sample_opens_several(settings: Settings) -> None:
    """What the pool saves: a run's sample borrows a PostgreSQL connection several times (the
    figures with the busiest domains, the timeline, the errors), and with nothing kept idle each
    borrow opens one, as every read did before."""
    seed(settings)
    links = Connections(settings, idle_kept=0)
    views = Views(settings, DashboardSettings(), links=links)
    try:
        produce = producer(Dashboard.build(settings, DashboardSettings(), views), "run", RUN, acting=True)
        for _ in range(3):
            produce()
        assert links.db_opened >= 3 * 3
    finally:
        links.close()
