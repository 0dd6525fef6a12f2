"""python -m ops.runs delete RUN and ops.crawl --fresh: a run's rows, Redis keys and hold queue
go, another run's stay; refused while the run has URLs queued or held, unless --force."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pika.exceptions
import pytest
import redis

from ops.crawl import forget_run
from ops.run_delete import delete_run
from ops.runs import pause
from producer.dedup import Dedup
from shared.amqp import broker
from shared.errors import ConfigError
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import held_queue
from shared.settings import Settings
from shared.urls import fingerprint
from tests.e2e.conftest import service_env
from tests.integration.test_runs import hold, tasks

RUN = "it-runs"  # the run tests.integration.test_runs.hold holds messages of
OTHER = "it-runs-2"  # a run whose name starts with the other's: none of its keys may go


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, OPERATOR)
    yield made
    made.close()


def make_run(settings: Settings, client: redis.Redis, run_id: str, urls: list[str]) -> None:
    """A run as the pipeline leaves it: published and confirmed URLs, counters, a state, one
    row of each kind, every URL accounted for."""
    keys = Keys(settings.redis_prefix)
    dedup = Dedup(client, keys, run_id, owner=f"owner-{run_id}")
    fps = [fingerprint(url) for url in urls]
    dedup.claim(fps)
    dedup.confirm(fps, {"enqueued.bulk": len(urls)})
    dedup.beat()
    for key in client.scan_iter(keys.all_pattern()):
        # The heartbeat's keys live 5 s: kept, so that none lapses between the test's looks on
        # a slow machine and passes for one the delete removed.
        client.persist(key)
    client.set(keys.run_seeded(run_id), b"{}")
    # A discovery run's keys: its options, its hosts' counts, a frontier's mark left by a kill.
    client.set(keys.run_discovery(run_id), b"{}")
    client.hset(keys.run_discovered_hosts(run_id), "a.test", 3)
    client.hset(keys.run_frontier(run_id), "frontier-1", 0)
    db.ensure_schema(settings)
    with db.connect(settings) as conn:
        page, dead, skip = urls
        conn.execute(
            "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id)"
            " VALUES (%s, %s, %s, 200, 'bulk', 'w')",
            (run_id, page, page),
        )
        conn.execute(
            "INSERT INTO dead_letters (run_id, url, reason, body) VALUES (%s, %s, 'http_500', '')",
            (run_id, dead),
        )
        conn.execute("INSERT INTO skips (run_id, url, reason) VALUES (%s, %s, 'robots')", (run_id, skip))
        conn.execute("INSERT INTO run_discovery (run_id, options) VALUES (%s, '{}')", (run_id,))
        conn.commit()


def run_keys(settings: Settings, client: redis.Redis) -> set[str]:
    return {key.decode() for key in client.scan_iter(Keys(settings.redis_prefix).all_pattern())}


def discovery_runs(settings: Settings) -> list[str]:
    with db.connect(settings) as conn:
        rows = conn.execute(
            "SELECT run_id FROM run_discovery WHERE run_id IN (%s, %s) ORDER BY run_id", (RUN, OTHER)
        )
        return [str(row[0]) for row in rows.fetchall()]


def row_runs(settings: Settings) -> list[tuple[str, int]]:
    with db.connect(settings) as conn:
        found = conn.execute(
            "SELECT run_id, count(*) FROM (SELECT run_id FROM pages UNION ALL SELECT run_id FROM dead_letters"
            " UNION ALL SELECT run_id FROM skips) AS r GROUP BY run_id ORDER BY run_id"
        ).fetchall()
    return [(str(run), int(str(n))) for run, n in found]


URLS = ["https://a.test/1", "https://a.test/2", "https://a.test/3"]
OTHER_URLS = ["https://b.test/1", "https://b.test/2", "https://b.test/3"]


def test_delete_removes_the_runs_rows_and_keys_and_nothing_else(
    settings: Settings, client: redis.Redis
) -> None:
    make_run(settings, client, RUN, URLS)
    make_run(settings, client, OTHER, OTHER_URLS)
    before = run_keys(settings, client)
    assert row_runs(settings) == [(RUN, 3), (OTHER, 3)]
    keys = Keys(settings.redis_prefix)

    deleted = delete_run(settings, client, keys, RUN, force=False)

    after = run_keys(settings, client)
    gone = before - after
    assert deleted.keys == len(gone) and deleted.rows == 3
    assert all(f":{RUN}:" in key or "{" + RUN + ":" in key for key in gone)
    assert keys.run_stats(RUN) in gone and keys.run_seeded(RUN) in gone
    assert {keys.run_discovery(RUN), keys.run_discovered_hosts(RUN), keys.run_frontier(RUN)} <= gone
    assert not any(f":{RUN}:" in key or "{" + RUN + ":" in key for key in after)
    assert keys.run_stats(OTHER) in after
    assert row_runs(settings) == [(OTHER, 3)]
    assert discovery_runs(settings) == [OTHER]  # the options kept beside Redis's go too
    # The same run id starts from nothing: its URLs are new again.
    assert Dedup(client, keys, RUN).claim([fingerprint(URLS[0])]).is_new == [True]


def test_delete_is_refused_while_urls_are_queued_or_held(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    make_run(settings, client, RUN, URLS)
    client.hincrby(keys.run_stats(RUN), "enqueued.bulk", 2)  # two more published, not yet done
    with pytest.raises(ConfigError, match="still has 2 URLs not yet done and 0 held messages"):
        delete_run(settings, client, keys, RUN, force=False)
    assert row_runs(settings) == [(RUN, 3)]

    client.hincrby(keys.run_stats(RUN), "enqueued.bulk", -2)
    pause(settings, client, keys, RUN)
    hold(settings, *tasks())
    with pytest.raises(ConfigError, match="0 URLs not yet done and 3 held messages"):
        delete_run(settings, client, keys, RUN, force=False)

    deleted = delete_run(settings, client, keys, RUN, force=True)
    assert deleted.held_messages == 3 and deleted.rows == 3
    connection = broker.connect(settings, "test")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
        connection.channel().queue_declare(held_queue(settings.crawl_namespace, RUN), passive=True)
    connection.close()
    assert keys.run_state(RUN) not in run_keys(settings, client)


def test_the_commands_refuse_in_one_line_and_delete_with_force(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    make_run(settings, client, RUN, URLS)
    client.hincrby(keys.run_stats(RUN), "enqueued.bulk", 1)
    env = service_env(settings)
    command = [sys.executable, "-m", "ops.runs", "delete", RUN]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--force" in refused.stderr
    fresh = subprocess.run(
        [sys.executable, "-m", "ops.crawl", "--fresh", "--run-id", RUN, "--urls", "/dev/null"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fresh.returncode == 2 and "still has 1 URLs not yet done" in fresh.stderr
    forced = subprocess.run([*command, "--force"], env=env, capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith(f"run {RUN} deleted: 3 rows, ")
    assert row_runs(settings) == []


def test_fresh_deletes_a_finished_run_before_crawling_it_again(
    settings: Settings, client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(settings, client, RUN, URLS)
    forget_run(settings, RUN)
    assert row_runs(settings) == []
    assert Keys(settings.redis_prefix).run_stats(RUN) not in run_keys(settings, client)
    assert capsys.readouterr().out.startswith(f"run {RUN}: starting fresh (3 rows and ")
