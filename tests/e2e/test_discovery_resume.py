"""A discovery crawl interrupted mid-run, then started again with the same --run-id: the second
crawl finishes the run, and the run's accounting is exact, as if nothing had happened.

    sigterm   the crawl stopped as Ctrl-C or a deploy stops it (exit 143): every process
              finishes what it fetched and returns the rest, so no page is fetched twice
    sigkill   the crawl and every process it started killed at once, as a machine that dies:
              the messages they held unacked are delivered again, so those pages may be
              fetched a second time (docs/RELIABILITY.md, "Worker killed"), never a third

Either way the stored, dead-lettered and skipped URLs are the test's own breadth-first answer,
each URL has exactly one outcome, and the run's `enqueued` counts each once: the start URL the
second producer reads again is a duplicate, and the links waiting in the discovery queue are
followed by the second crawl's frontier.
"""

from __future__ import annotations

import collections
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from ops.accounting import account
from ops.crawl import run_crawl
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import recorded_enqueued
from shared.settings import Settings
from tests.discovery_site import DiscoverySite, OtherSite, expected
from tests.e2e.conftest import service_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DEPTH = 5
# Slow enough that the interruption lands with most of the graph still to crawl.
SLOW = {"RATE_LIMIT_RPS": "2", "RETRY_DELAYS_S": "0.2,0.2"}


def rows_per_url(settings: Settings, run_id: str) -> collections.Counter[str]:
    """How many outcome rows each URL of the run has, over pages, dead letters and skips."""
    found: collections.Counter[str] = collections.Counter()
    with psycopg.connect(settings.database_url, options=f"-c search_path={settings.pg_schema}") as conn:
        for query in (
            "SELECT url FROM pages WHERE run_id = %s",
            "SELECT url FROM dead_letters WHERE run_id = %s AND state = 'dead'",
            "SELECT url FROM skips WHERE run_id = %s",
        ):
            found.update(str(row[0]) for row in conn.execute(query, (run_id,)))
    return found


def outcome_sets(settings: Settings, run_id: str) -> tuple[set[str], set[str], set[str]]:
    with psycopg.connect(settings.database_url, options=f"-c search_path={settings.pg_schema}") as conn:
        return (
            {str(r[0]) for r in conn.execute("SELECT url FROM pages WHERE run_id = %s", (run_id,))},
            {
                str(r[0])
                for r in conn.execute(
                    "SELECT url FROM dead_letters WHERE run_id = %s AND state = 'dead'", (run_id,)
                )
            },
            {str(r[0]) for r in conn.execute("SELECT url FROM skips WHERE run_id = %s", (run_id,))},
        )


def interrupted_crawl(settings: Settings, start: str, run_id: str, log_dir: Path, how: str) -> int:
    """ops.crawl started in a session of its own, stopped once a few URLs are accounted for;
    its exit code."""
    crawl = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ops.crawl",
            "--start",
            start,
            "--max-depth",
            str(DEPTH),
            "--workers",
            "1",
            "--run-id",
            run_id,
            "--log-dir",
            str(log_dir),
        ],
        env=service_env(settings, **SLOW),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its process group holds every process it starts
    )
    try:
        deadline = time.monotonic() + 120
        while account(settings, run_id).accounted < 4:
            assert crawl.poll() is None, crawl.communicate()[0].decode()
            assert time.monotonic() < deadline, "the first crawl stored nothing in 120 s"
            time.sleep(0.1)
        if how == "sigterm":
            crawl.send_signal(signal.SIGTERM)
        else:
            os.killpg(crawl.pid, signal.SIGKILL)
        crawl.communicate(timeout=120)
    finally:
        if crawl.poll() is None:
            os.killpg(crawl.pid, signal.SIGKILL)
            crawl.wait()
    return crawl.returncode


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_an_interrupted_discovery_run_is_finished_by_the_same_run_id_with_exact_accounting(
    settings: Settings, tmp_path: Path, how: str
) -> None:
    run_id = f"e2e-discover-resume-{how}"
    with OtherSite() as other, DiscoverySite(other.root) as site:
        answer = expected(site.graph, site.root, DEPTH)
        everything = answer.stored | answer.dead | answer.skipped
        code = interrupted_crawl(settings, site.url("/"), run_id, tmp_path / "first", how)
        assert code == (143 if how == "sigterm" else -signal.SIGKILL)
        assert account(settings, run_id).accounted < len(everything)  # interrupted mid-run

        out = io.StringIO()
        code = run_crawl(
            settings,
            ["--start", site.url("/"), "--max-depth", str(DEPTH)],
            1,
            run_id,
            service_env(settings, RETRY_DELAYS_S="0.2,0.2"),
            tmp_path / "again",
            180,
            out,
            discovering=True,
            quiet_s=0.5,
        )
        output = out.getvalue()
        assert code == 0, output
        assert f"{len(everything)} of {len(everything)}: ok" in output

        stored, dead, skipped = outcome_sets(settings, run_id)
        assert stored == answer.stored
        assert dead == answer.dead
        assert skipped == answer.skipped
        rows = rows_per_url(settings, run_id)
        assert set(rows) == everything
        assert set(rows.values()) == {1}, {url: n for url, n in rows.items() if n != 1}
        client = connect_redis(settings, OPERATOR)
        assert recorded_enqueued(client, Keys(settings.redis_prefix), run_id) == len(everything)
        client.close()

        fetches = collections.Counter(path for path in site.requested if path != "/robots.txt")
        allowed = 1 if how == "sigterm" else 2
        assert max(fetches.values()) <= allowed, {p: n for p, n in fetches.items() if n > allowed}
        assert other.requested == []
        assert "/secret" not in site.requested
