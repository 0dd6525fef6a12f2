"""A discovery crawl with every process running, on a site whose graph the test knows: for
depths 0, 1, 2 and 5 the stored, dead-lettered and skipped URLs are exactly the test's own
breadth-first answer, and the crawl accounts for all of them."""

from __future__ import annotations

import io
from pathlib import Path

import psycopg
import pytest

from ops.crawl import run_crawl
from shared.keys import Keys
from shared.redis_client import OPERATOR, connect_redis
from shared.runstate import recorded_counters
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
            2,
            run_id,
            service_env(settings, RETRY_DELAYS_S="0.2,0.2"),
            tmp_path,
            120,
            out,
            discovering=True,
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
