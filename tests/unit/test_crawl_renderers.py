"""When `ops.crawl` starts renderers: only for a crawl that renders, as many as asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.crawl_renderers import RENDERER_POOL, renderer_launches, renderers_line, why_render
from ops.crawl_workers import WorkerLaunch
from shared.errors import ConfigError
from shared.settings import Settings

pytestmark = pytest.mark.unit


def settings_with(tmp_path: Path, rules: str = "", **env: str) -> Settings:
    routing = tmp_path / "routing.toml"
    routing.write_text(rules or '[[rule]]\nqueue = "bulk"\n', encoding="utf-8")
    return Settings.from_env({"ROUTING_FILE": str(routing), "CHROMIUM_PATH": "/bin/sh", **env})


def test_a_crawl_that_renders_nothing_starts_no_renderer(tmp_path: Path) -> None:
    settings = settings_with(tmp_path)
    assert why_render(settings) is None
    assert renderer_launches(settings, None) == []
    assert renderer_launches(settings, 3) == []
    assert renderers_line(settings, []) == ""


def test_render_auto_starts_renderer_processes_of_them(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, RENDER="auto", RENDERER_PROCESSES="2")
    assert why_render(settings) == "RENDER=auto"
    launches = renderer_launches(settings, None)
    assert launches == [WorkerLaunch(RENDERER_POOL, ("--processes", "2"), 2, module="renderer")]
    assert (
        renderers_line(settings, launches) == "renders (RENDER=auto): 2 renderers with 4 pages in flight each"
    )
    assert renderer_launches(settings, 1)[0].args == ("--processes", "1")


def test_a_routing_rule_that_renders_starts_one(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, '[[rule]]\nurl_pattern = "^http://app/"\nrender = "always"\n')
    assert 'has render = "always"' in str(why_render(settings))
    assert [launch.module for launch in renderer_launches(settings, None)] == ["renderer"]


def test_renderers_0_starts_none_and_says_so(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, RENDER="auto")
    assert renderer_launches(settings, 0) == []
    assert "--renderers 0" in renderers_line(settings, [])


def test_mistakes_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--renderers: must be 0 or more$"):
        renderer_launches(settings_with(tmp_path, RENDER="auto"), -1)
    missing = settings_with(tmp_path, RENDER="auto", CHROMIUM_PATH="/nowhere/chromium")
    with pytest.raises(ConfigError, match=r"^CHROMIUM_PATH: '/nowhere/chromium' is not an executable"):
        renderer_launches(missing, None)
