"""The browser's life: contexts replaced after BROWSER_MAX_PAGES, the browser restarted past its
memory cap, and nothing of the old browser left."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bench.script_site import ScriptSite
from renderer.engine import RenderEngine
from renderer.processes import browser_groups
from renderer.watchdog import Watchdog
from shared.http.netguard import AddressGuard, address_policy
from tests.renderer.conftest import render_settings

pytestmark = [pytest.mark.renderer, pytest.mark.timeout(120)]


@contextmanager
def engine_with(**changes: object) -> Iterator[RenderEngine]:
    settings = render_settings(**changes)
    watchdog = Watchdog.start()
    engine = RenderEngine(settings, AddressGuard(address_policy(settings)), watchdog).start()
    try:
        yield engine
    finally:
        engine.close()
        watchdog.stop()


def test_a_context_is_replaced_after_its_pages(script_site: ScriptSite) -> None:
    with engine_with(render_concurrency=1, browser_max_pages=2) as engine:
        for _ in range(5):
            assert "content inserted" in engine.render(script_site.url("/content")).html
        assert engine.pool is not None
        assert (engine.pool.figures.contexts, engine.pool.figures.launches) == (3, 1)


def test_a_browser_past_its_memory_cap_is_replaced_and_gone(script_site: ScriptSite) -> None:
    with engine_with(render_concurrency=2, browser_max_rss_mb=1) as engine:
        engine.render(script_site.url("/content"))  # a browser is far over 1 MB: replaced after
        assert engine.pool is not None and engine.pool.figures.restarts_for_memory == 1
        assert engine.pool.figures.launches == 1
        assert browser_groups(os.getpid()) == []  # the old browser ended whole
        rendered = engine.render(script_site.url("/content"))
        assert "content inserted" in rendered.html
        assert engine.pool.figures.launches == 2
