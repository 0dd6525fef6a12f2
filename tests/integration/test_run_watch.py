"""ops.crawl's watch over a run through a blip of PostgreSQL or Redis: "?" meanwhile, the
figures again once the service is back, and a clear failure only after a long outage."""

from __future__ import annotations

import pytest
import redis

from ops.crawl_processes import CrawlFailed
from ops.run_watch import RunWatch
from shared.postgres import db
from shared.progress import Snapshot
from shared.settings import Settings
from tests.fakes import FakeTime
from tests.ports import closed_port


def test_a_lost_postgresql_connection_shows_unknown_then_is_opened_again(settings: Settings) -> None:
    db.ensure_schema(settings)
    with RunWatch(settings, "watched") as watch:
        assert isinstance(watch.snapshot_if_reachable(), Snapshot)
        tally_pid = watch._tally._connection().info.backend_pid
        with db.connect(settings, autocommit=True) as admin:  # a blip: the server drops the session
            admin.execute("SELECT pg_terminate_backend(%s)", (tally_pid,))
        assert watch.snapshot_if_reachable() is None
        assert "PostgreSQL" in watch.unreachable
        again = watch.snapshot_if_reachable()  # a new connection
        assert isinstance(again, Snapshot) and again.done == 0
        assert watch.unreachable == ""


def test_redis_away_shows_unknown_and_gives_up_only_after_the_outage_limit(settings: Settings) -> None:
    db.ensure_schema(settings)
    clock = FakeTime(100.0)
    with RunWatch(settings, "watched", outage_limit_s=120, clock=clock) as watch:
        reachable = watch._redis
        watch._redis = redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=1)
        try:
            assert watch.snapshot_if_reachable() is None
            clock.now += 119
            assert watch.snapshot_if_reachable() is None  # not yet given up
            watch._redis.close()
            watch._redis = reachable  # back: the outage is forgotten
            assert isinstance(watch.snapshot_if_reachable(), Snapshot)
            watch._redis = redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=1)
            assert watch.snapshot_if_reachable() is None
            clock.now += 120
            with pytest.raises(
                CrawlFailed, match=r"^progress could not be read for 120 s: cannot reach Redis at "
            ):
                watch.snapshot_if_reachable()
        finally:
            watch._redis.close()
            watch._redis = reachable
