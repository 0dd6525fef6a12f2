"""python -m renderer as a process: a run routed to it by `render = "always"` ends N of N, each
page as its kind should; then a SIGKILL of the renderer leaves no Chromium process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from bench.script_site import SITE_HOST, Canary, ScriptSite
from ops.accounting import account
from renderer.processes import all_processes, browser_groups, descendants, group_members, read_process
from shared.postgres import db
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.renderer.conftest import RunningServices

pytestmark = pytest.mark.timeout(240)
STRAY_GRACE_S = 30.0


def rows(settings: Settings, query: str, *params: object) -> dict[object, object]:
    with db.connect(settings, autocommit=True) as conn:
        return {key: value for key, value in conn.execute(query, params)}


def test_a_rendered_run_is_accounted_and_a_killed_renderer_leaves_no_chromium(
    settings: Settings, script_site: ScriptSite, tmp_path: Path
) -> None:
    db.ensure_schema(settings)
    routing = tmp_path / "routing.toml"
    routing.write_text('[[rule]]\nrender = "always"\n', encoding="utf-8")
    env = service_env(
        settings,
        FETCH_ALLOWLIST=f"{SITE_HOST}/32",
        ROUTING_FILE=str(routing),
        RENDER_DEADLINE_S="10",  # room for a loaded machine: only /memory should fail
        RENDER_CONCURRENCY="3",
        MAX_ATTEMPTS="2",
    )
    with RunningServices(env, tmp_path / "renderer.log", "renderer", "dlq_consumer") as services:
        renderer = services.processes["renderer"]
        produced = services.seed("r1", script_site.url("/sitemap.xml"))
        assert json.loads(produced.stdout)["enqueued_total"] == 6
        deadline = time.monotonic() + 150
        while (accounting := account(settings, "r1")).accounted < 6:
            assert time.monotonic() < deadline, services.log_text()
            assert renderer.poll() is None, services.log_text()
            time.sleep(0.5)
        assert accounting.accounted == 6  # N of N
        texts = rows(settings, "SELECT url, body_text FROM pages WHERE run_id = %s", "r1")
        assert "content inserted by a script" in str(texts[script_site.url("/content")])
        assert "never settles" in str(texts[script_site.url("/unsettled")])
        assert "opens a popup" in str(texts[script_site.url("/popup")])
        assert "content inserted by a script" in str(texts[script_site.url("/away")])  # where it went
        links = rows(settings, "SELECT url, links FROM pages WHERE run_id = %s", "r1")[
            script_site.url("/links")
        ]
        assert script_site.url("/popup") in str(links)
        dead = rows(settings, "SELECT url, reason FROM dead_letters WHERE run_id = %s", "r1")
        assert dead == {script_site.url("/memory"): "render_crashed"}

        groups = browser_groups(renderer.pid)
        assert groups, "the renderer runs a browser"
        members = {(p.pid, p.started) for group in groups for p in group_members(group)}
        watchdogs = [p.pid for p in descendants(renderer.pid) if "renderer.watchdog" in p.command]
        assert members
        os.kill(renderer.pid, signal.SIGKILL)
        renderer.wait(timeout=10)
        deadline = time.monotonic() + STRAY_GRACE_S
        while left := [p for p in all_processes() if (p.pid, p.started) in members or p.pgid in groups]:
            assert time.monotonic() < deadline, f"Chromium processes left: {left}"
            time.sleep(0.5)
        assert watchdogs and all(read_process(pid) is None for pid in watchdogs)  # its work done


def test_render_auto_sends_only_the_script_shell_on_and_the_run_counts_it(
    settings: Settings, canary: Canary, tmp_path: Path
) -> None:
    db.ensure_schema(settings)
    site = ScriptSite(canary, ("/content", "/plain"))
    env = service_env(settings, FETCH_ALLOWLIST=f"{SITE_HOST}/32", RENDER="auto", RENDER_DEADLINE_S="6")
    with (
        closing(site),
        RunningServices(env, tmp_path / "services.log", "worker", "renderer", "dlq_consumer") as services,
    ):
        services.seed("auto", site.url("/sitemap.xml"))
        report = subprocess.run(
            [sys.executable, "-m", "ops.run_report", "--run", "auto", "--wait", "90"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.returncode == 0, report.stdout + report.stderr + services.log_text()
        assert "accounted for          2 of 2: ok" in report.stdout
        assert "sent to render         1   (script shell 1)" in report.stdout
        texts = rows(settings, "SELECT url, body_text FROM pages WHERE run_id = %s", "auto")
        assert "content inserted by a script" in str(texts[site.url("/content")])  # rendered
        assert "no script needed" in str(texts[site.url("/plain")])  # as the worker fetched it
