"""The renderer's own dead-letter reasons, reached for real by a running renderer: a page whose
load never ends is a render_timeout (retried, then dead-lettered), a download and a page that
navigates where the guard refuses are render_refused (at once). Each URL ends in exactly one
place, with that reason, and the run is accounted N of N; a page that opens dialogs is stored
with them dismissed."""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path

import pytest
import redis

from bench.script_site import SITE_HOST, Canary, ScriptSite
from ops.accounting import account
from renderer.figures import RENDER_MS_FIELD, RENDERS_PREFIX
from shared.postgres import db
from shared.redis.keys import Keys
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.renderer.conftest import RunningServices

pytestmark = pytest.mark.timeout(240)
# Long enough for a page to load on a loaded machine: only the page that never loads meets it.
DEADLINE_S = 10
PATHS = ("/never-loads", "/download", "/hostile", "/dialog")
EXPECTED = {
    "/never-loads": ("dead", "render_timeout"),
    "/download": ("dead", "render_refused"),
    "/hostile": ("dead", "render_refused"),
    "/dialog": ("page", None),
}


def places(settings: Settings, run_id: str) -> dict[str, list[tuple[str, str | None]]]:
    """Every place a URL of the run ended in: a page, a dead letter (its reason), a skip (its
    reason)."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    with db.connect(settings, autocommit=True) as conn:
        for url, kind, reason in conn.execute(
            "SELECT url, 'page', NULL FROM pages WHERE run_id = %(run)s"
            " UNION ALL SELECT url, 'dead', reason FROM dead_letters WHERE run_id = %(run)s"
            " UNION ALL SELECT url, 'skip', reason FROM skips WHERE run_id = %(run)s",
            {"run": run_id},
        ):
            found.setdefault(str(url), []).append((str(kind), None if reason is None else str(reason)))
    return found


def test_render_timeout_and_render_refused_end_each_url_in_one_place(
    settings: Settings, canary: Canary, tmp_path: Path
) -> None:
    db.ensure_schema(settings)
    site = ScriptSite(canary, PATHS)
    routing = tmp_path / "routing.toml"
    routing.write_text('[[rule]]\nrender = "always"\n', encoding="utf-8")
    env = service_env(
        settings,
        FETCH_ALLOWLIST=f"{SITE_HOST}/32",
        ROUTING_FILE=str(routing),
        RENDER_DEADLINE_S=str(DEADLINE_S),
        RENDER_CONCURRENCY="2",
        MAX_ATTEMPTS="2",
    )
    with (
        closing(site),
        RunningServices(env, tmp_path / "services.log", "renderer", "dlq_consumer") as services,
    ):
        services.seed("outcomes", site.url("/sitemap.xml"))
        deadline = time.monotonic() + 150
        while (accounting := account(settings, "outcomes")).accounted < len(PATHS):
            assert time.monotonic() < deadline, services.log_text()
            assert services.all_alive(), services.log_text()
            time.sleep(0.5)
        time.sleep(1.0)  # a second row for any URL would show now
        assert account(settings, "outcomes").accounted == len(PATHS)  # N of N
        assert accounting.retries == 1  # the timeout's second attempt; refusals are not retried
        ended = places(settings, "outcomes")
        assert ended == {site.url(path): [where] for path, where in EXPECTED.items()}
        with db.connect(settings, autocommit=True) as conn:
            row = conn.execute(
                "SELECT body_text FROM pages WHERE run_id = %s AND url = %s",
                ("outcomes", site.url("/dialog")),
            ).fetchone()
        assert row is not None and "dialogs dismissed: declined" in str(row[0])
        assert canary.connections == 0
        # The page that never loaded was asked for its image on both attempts; then no more.
        assert site.requests.count("/hang.png") == 2
        # The run's render figures (renderer/figures.py): every attempt, with its outcome.
        client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        stats: dict[str, str] = client.hgetall(Keys(settings.redis_prefix).run_stats("outcomes"))  # type: ignore[assignment]
        client.close()
        renders = {
            key[len(RENDERS_PREFIX) :]: int(value)
            for key, value in stats.items()
            if key.startswith(RENDERS_PREFIX)
        }
        assert renders == {"render_timeout": 2, "render_refused": 2, "ok": 1}
        assert int(stats[RENDER_MS_FIELD]) >= 2 * DEADLINE_S * 1000  # two attempts that took the deadline
