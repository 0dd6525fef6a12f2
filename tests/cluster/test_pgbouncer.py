"""The pipeline through PgBouncer in transaction pooling mode (`make pgbouncer-up`, then
`make test-pgbouncer`): every URL accounted for exactly once, on fewer server connections than
clients, and none of the session state a pooler drops is relied on."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.pgbouncer import ConnectionSampler
from demo_site.server import DemoSite
from ops.accounting import account
from ops.crawl import Processes, run_crawl
from shared.postgres import db
from shared.settings import Settings
from tests.cluster.conftest import DATABASE, pgbouncer_show
from tests.e2e.conftest import service_env

pytestmark = pytest.mark.timeout(400)


def rows(settings: Settings, query: str, *params: object) -> list[tuple[Any, ...]]:
    with db.connect(settings, autocommit=True) as conn:
        return list(conn.execute(query, params))


def transactions_through_pgbouncer() -> int:
    stats = pgbouncer_show("STATS")
    return sum(int(row["total_xact_count"]) for row in stats if row["database"] == DATABASE)


def pooled_env(settings: Settings, **overrides: str) -> dict[str, str]:
    return service_env(settings, DATABASE_POOLER="transaction", **overrides)


def test_a_crawl_through_pgbouncer_accounts_for_every_url_on_a_few_server_connections(
    pooled: Settings, pgbouncer: dict[str, str], demo_site: DemoSite, tmp_path: Path
) -> None:
    expected = demo_site.config.expected()
    pool_size = int(pgbouncer["default_pool_size"])
    before = transactions_through_pgbouncer()
    # A pool of 10 worker processes: 10 writers, the dead-letter consumer and the progress
    # count are 12 clients, more than the pool has server connections.
    out = io.StringIO()
    with ConnectionSampler(DATABASE, every_s=0.1) as server:
        code = run_crawl(
            pooled,
            ["--sitemap", demo_site.config.sitemap_index_url],
            10,
            "pooled-main",
            pooled_env(pooled),
            tmp_path / "logs",
            300,
            out,
        )
    assert code == 0, out.getvalue()

    a = account(pooled, "pooled-main")
    assert a.accounted == expected.unique_total
    stored = {str(url) for (url,) in rows(pooled, "SELECT url FROM pages WHERE run_id = %s", "pooled-main")}
    assert stored == set(expected.normal) | set(expected.flaky)
    dead = dict(rows(pooled, "SELECT url, reason FROM dead_letters WHERE run_id = %s", "pooled-main"))
    assert dead == {
        **dict.fromkeys(expected.broken, "http_500"),
        **dict.fromkeys(expected.missing, "http_404"),
    }
    writes = rows(pooled, "SELECT sum(writes), count(*) FROM pages WHERE run_id = %s", "pooled-main")
    assert writes == [(len(stored), len(stored))]  # each page written once: no redelivery
    attempts = dict(rows(pooled, "SELECT url, failed_attempts FROM pages WHERE run_id = %s", "pooled-main"))
    assert {attempts[url] for url in expected.flaky} == {2}

    # It all went through PgBouncer, on no more server connections than its pool holds.
    assert transactions_through_pgbouncer() - before > len(stored)
    assert 0 < server.most <= pool_size


def test_replaying_dead_letters_through_pgbouncer(
    pooled: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    expected = demo_site.config.expected()
    out = io.StringIO()
    env = pooled_env(pooled)
    code = run_crawl(
        pooled,
        ["--sitemap", demo_site.config.sitemap_index_url],
        1,
        "pooled-replay",
        env,
        tmp_path / "a",
        240,
        out,
    )
    assert code == 0, out.getvalue()
    demo_site.fix()

    procs = Processes(tmp_path / "replay-logs", env)
    (tmp_path / "replay-logs").mkdir()
    procs.start("worker", "worker")
    procs.start("dlq_consumer", "dlq_consumer")
    try:
        replay = subprocess.run(
            [
                sys.executable,
                "-m",
                "dlq_consumer",
                "replay",
                "--run",
                "pooled-replay",
                "--reason",
                "http_500",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert replay.returncode == 0, replay.stderr
        want = len(expected.normal) + len(expected.flaky) + len(expected.broken)
        deadline = time.monotonic() + 60
        while account(pooled, "pooled-replay").stored < want:
            assert time.monotonic() < deadline, "replayed URLs were not stored in time"
            procs.check_alive()
            time.sleep(0.25)
    finally:
        codes = procs.stop_all()
    assert set(codes.values()) == {0}
    assert account(pooled, "pooled-replay").dead_by_reason == {"http_404": len(expected.missing)}
    replayed = rows(
        pooled, "SELECT count(*) FROM dead_letters WHERE run_id = %s AND state = 'replayed'", "pooled-replay"
    )
    assert replayed == [(len(expected.broken),)]


def test_statements_repeated_across_server_sessions_neither_prepare_nor_lose_the_schema(
    pooled: Settings,
) -> None:
    db.ensure_schema(pooled)
    with db.connect(pooled, autocommit=True) as one, db.connect(pooled, autocommit=True) as two:
        for n in range(20):  # psycopg would prepare from the fifth run on, were it allowed to
            for conn in (one, two):
                assert conn.execute("SHOW search_path").fetchone() == (pooled.pg_schema,)
                assert conn.execute("SELECT count(*) + %s FROM pages", (n,)).fetchone() == (n,)
        # executemany, which psycopg sends in pipeline mode, in a transaction and outside one.
        params = [{"run_id": "pooled-many", "url": f"http://127.0.0.1/{n}", "reason": "x"} for n in range(30)]
        insert = (
            "INSERT INTO skips (run_id, url, reason, detail, worker_id) "
            "VALUES (%(run_id)s, %(url)s, %(reason)s, '', 'w')"
        )
        with one.transaction(), one.cursor() as cur:
            cur.executemany(insert, params[:15])
        with two.cursor() as cur:
            cur.executemany(insert, params[15:])
    assert rows(pooled, "SELECT count(*) FROM skips WHERE run_id = %s", "pooled-many") == [(30,)]


def test_without_the_pooler_setting_prepared_statements_break_behind_pgbouncer(pooled: Settings) -> None:
    """Why DATABASE_POOLER exists: the same query prepared by psycopg on one server session is
    unknown, or already known, on the next. If this stops failing, PgBouncer is not pooling
    transactions (or carries prepared statements, as 1.21 and later can)."""
    with (
        pytest.raises(psycopg.errors.ProgrammingError),  # the statement missing, or a duplicate
        psycopg.connect(pooled.database_url, autocommit=True, prepare_threshold=0) as one,
        psycopg.connect(pooled.database_url, autocommit=True, prepare_threshold=0) as two,
    ):
        for n in range(20):
            one.execute("SELECT %s::int", (n,))
            two.execute("SELECT %s::int + 1", (n,))


def test_services_starting_together_migrate_the_schema_once(pooled: Settings) -> None:
    """Session advisory locks would leak on a pooled server session and block every later start."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            db.ensure_schema(pooled)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert rows(pooled, "SELECT count(*) FROM schema_applied") == [(1,)]
    db.ensure_schema(pooled)  # and once more, after them: no lock was left behind
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
        held = admin.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = %s",
            (DATABASE,),
        ).fetchone()
    assert held == (0,)
