"""A run's progress from any machine: rate from the outcomes committed in the window, total
from the run's Redis counters, and "producing" from a producer's heartbeat."""

from __future__ import annotations

import psycopg
import pytest

from ops.run_progress import ProgressReader, run_progress
from producer.dedup import Dedup
from shared.postgres import db
from shared.postgres.skips import UPSERT_SKIP
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings

pytestmark = pytest.mark.integration

RUN = "progressing"


def store_page(conn: psycopg.Connection[tuple[object, ...]], url: str, ago_s: float) -> None:
    conn.execute(
        "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id, fetched_at)"
        " VALUES (%s, %s, %s, 200, 'bulk', 'w', now() - make_interval(secs => %s))",
        (RUN, url, url, ago_s),
    )


def test_progress_counts_the_window_and_sees_a_live_producer(settings: Settings) -> None:
    db.ensure_schema(settings)
    keys = Keys(settings.redis_prefix)
    client = connect_redis(settings, OPERATOR)
    try:
        client.hset(keys.run_stats(RUN), mapping={"enqueued.bulk": 100, "enqueued.priority": 20})
        with db.connect(settings, autocommit=True) as conn:
            for n in range(40):  # 40 pages 10 minutes ago, then 30 in the last half minute
                store_page(conn, f"https://a.test/old{n}", 600)
            for n in range(30):
                store_page(conn, f"https://a.test/new{n}", 5)
            conn.execute(
                UPSERT_SKIP,
                {
                    "run_id": RUN,
                    "url": "https://a.test/s",
                    "reason": "robots",
                    "detail": "",
                    "worker_id": "w",
                },
            )
        progress = run_progress(settings, RUN)
        assert (progress.enqueued, progress.stored, progress.skipped, progress.left) == (120, 70, 1, 49)
        assert progress.pages_per_s == pytest.approx(31 / 30)
        assert progress.eta_s == pytest.approx(49 / (31 / 30))
        assert not progress.producing

        Dedup(client, keys, RUN).beat()  # what a producer's heartbeat does every second
        with ProgressReader(settings) as reader:
            assert reader.read(RUN).producing
            assert reader.read(RUN).line().endswith("still enqueuing, ? queued, ETA >47s")
            client.delete(keys.run_producing(RUN))  # as it lapses after the producer's end
            Dedup(client, keys, f"{RUN}2").beat()  # another run's producer
            assert not reader.read(RUN).producing
    finally:
        client.close()
