"""A discovery crawl with every process running, on a site whose graph the test knows: for
depths 0, 1, 2 and 5 the stored, dead-lettered and skipped URLs are exactly the test's own
breadth-first answer, and the crawl accounts for all of them."""

from __future__ import annotations

import concurrent.futures
import io
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from ops.crawl import run_crawl
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import recorded_counters
from shared.settings import Settings
from tests.discovery_site import DiscoverySite, OtherSite, expected
from tests.e2e.conftest import service_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def outcomes(settings: Settings, run_id: str) -> tuple[set[str], set[str], set[str]]:
    with psycopg.connect(settings.database_url, options=f"-c search_path={settings.pg_schema}") as conn:
        stored = {row[0] for row in conn.execute("SELECT url FROM pages WHERE run_id = %s", (run_id,))}
        dead = {
            row[0]
            for row in conn.execute(
                "SELECT url FROM dead_letters WHERE run_id = %s AND state = 'dead'", (run_id,)
            )
        }
        skipped = {row[0] for row in conn.execute("SELECT url FROM skips WHERE run_id = %s", (run_id,))}
    return stored, dead, skipped


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_a_discovery_crawl_finds_exactly_the_breadth_first_answer(
    settings: Settings, tmp_path: Path, depth: int
) -> None:
    with OtherSite() as other, DiscoverySite(other.root) as site:
        run_id = f"e2e-discover-{depth}"
        out = io.StringIO()
        code = run_crawl(
            settings,
            ["--start", site.url("/"), "--max-depth", str(depth)],
            1,
            run_id,
            service_env(settings, RETRY_DELAYS_S="0.2,0.2"),
            tmp_path,
            120,
            out,
            discovering=True,
            quiet_s=0.5,
        )
        answer = expected(site.graph, site.root, depth)
        assert code == 0, out.getvalue()
        stored, dead, skipped = outcomes(settings, run_id)
        assert stored == answer.stored
        assert dead == answer.dead
        assert skipped == answer.skipped
        total = len(answer.stored | answer.dead | answer.skipped)
        assert f"of {total}: ok" in out.getvalue()
        assert other.requested == []  # the other host is out of scope
        assert "/secret" not in site.requested
        assert not {"/meta-child", "/header-child"} & set(site.requested)
        client = connect_redis(settings, OPERATOR)
        stats = recorded_counters(client, Keys(settings.redis_prefix), run_id)
        client.close()
        if depth >= 1:
            assert stats["discovered.out_of_scope"] >= 1
            # "/" links itself and spells /q?a=1&b=2 two ways (the parser merges /a#top, /./a
            # and /x/../a with /a before they leave the worker).
            assert stats["discovered.duplicate"] >= 2
        assert stats.get("discovered.depth", 0) >= 1


BAD_DISCOVERY = [
    (["--start", "ftp://example.com/"], "--start 'ftp://example.com/'"),
    (["--start", "http://exa mple.com/"], "--start 'http://exa mple.com/'"),
    (["--start", "http://10.0.0.1/"], "--start 'http://10.0.0.1/'"),
    (["--start", "http://example.com/", "--include", "("], "--include '('"),
    (["--start", "http://example.com/", "--max-depth", "-1"], "--max-depth -1"),
]


# The producer runs the same checks (producer/discovery_scope.py, unit-tested case by case).
@pytest.mark.parametrize(
    ("module", "cases"), [("ops.crawl", BAD_DISCOVERY), ("producer", BAD_DISCOVERY[2:4])]
)
def test_bad_discovery_input_is_one_line_exit_2_and_queues_nothing(
    settings: Settings, module: str, cases: list[tuple[list[str], str]]
) -> None:
    def attempt(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", module, "--run-id", "e2e-bad-start", *args],
            env={**service_env(settings), "FETCH_ALLOWLIST": ""},  # the guard as shipped
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        attempts = list(pool.map(attempt, [args for args, _ in cases]))
    for (args, named), done in zip(cases, attempts, strict=True):
        assert done.returncode == 2, (args, done.stderr)
        assert named in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr
    client = connect_redis(settings, OPERATOR)
    assert list(client.scan_iter(Keys(settings.redis_prefix).all_pattern())) == []
    client.close()
