"""A discovery crawl through the renderer, run by `ops.crawl`: on a site whose links only
scripts build, the crawl starts a renderer of its own because it renders (RENDER=auto, or a
routing rule with render = "always"), and the links found on the rendered pages feed the
frontier until every page is reached, accounted N of N."""

from __future__ import annotations

import io
from pathlib import Path

import psycopg
import pytest
import requests

from bench.script_site import SITE_HOST, SPA_PAGES, Canary, ScriptSite, spa_paths
from ops.crawl import run_crawl
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import recorded_counters
from shared.settings import Settings
from tests.e2e.conftest import service_env
from worker.parse.page import parse_page

pytestmark = pytest.mark.timeout(300)


def test_the_shells_alone_hold_no_link(canary: Canary) -> None:
    """What a crawl that does not render would find: the pages' links are not in their HTML."""
    site = ScriptSite(canary)
    try:
        for path in spa_paths():
            shell = requests.get(site.url(path), timeout=10).text
            assert parse_page(shell, site.url(path)).links == ()
    finally:
        site.close()


@pytest.mark.parametrize("how", ["auto", "routing"])
def test_a_discovery_crawl_follows_the_links_scripts_build(
    settings: Settings, canary: Canary, tmp_path: Path, how: str
) -> None:
    site = ScriptSite(canary)
    routing = tmp_path / "routing.toml"
    routing.write_text('[[rule]]\nrender = "always"\n', encoding="utf-8")
    render_env = {"RENDER": "auto"} if how == "auto" else {"ROUTING_FILE": str(routing)}
    run_id = f"render-discover-{how}"
    out = io.StringIO()
    try:
        code = run_crawl(
            settings,
            ["--start", site.url("/spa/0"), "--max-depth", "5"],
            1,
            run_id,
            service_env(settings, FETCH_ALLOWLIST=f"{SITE_HOST}/32", RENDER_DEADLINE_S="8", **render_env),
            tmp_path / "logs",
            240,
            out,
            discovering=True,
            quiet_s=1.0,
        )
        assert code == 0, out.getvalue()
        reason = "RENDER=auto" if how == "auto" else 'has render = "always"'
        assert reason in out.getvalue() and "1 renderer with" in out.getvalue()
        assert f"{SPA_PAGES} of {SPA_PAGES}: ok" in out.getvalue()
        with psycopg.connect(settings.database_url, options=f"-c search_path={settings.pg_schema}") as conn:
            stored: dict[str, str] = dict(
                conn.execute("SELECT url, body_text FROM pages WHERE run_id = %s", (run_id,)).fetchall()
            )
        assert set(stored) == {site.url(path) for path in spa_paths()}
        assert all("built by a script" in str(text) for text in stored.values())
        client = connect_redis(settings, OPERATOR)
        stats = recorded_counters(client, Keys(settings.redis_prefix), run_id)
        client.close()
        assert stats.get("renders.ok", 0) + stats.get("renders.unsettled", 0) == SPA_PAGES
        if how == "auto":  # each page came to a worker first, as a shell
            assert stats["sent_to_render.script_shell"] == SPA_PAGES
        else:
            assert stats.get("sent_to_render.script_shell", 0) == 0
    finally:
        site.close()
