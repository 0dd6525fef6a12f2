"""Fixtures of the renderer's tests: a script-built site, a canary, and a running engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from bench.script_site import SITE_HOST, Canary, ScriptSite
from renderer.engine import RenderEngine
from renderer.watchdog import Watchdog
from shared.http.netguard import AddressGuard, address_policy
from shared.settings import Settings


@pytest.fixture
def canary() -> Iterator[Canary]:
    listener = Canary()
    yield listener
    listener.close()


@pytest.fixture
def script_site(canary: Canary) -> Iterator[ScriptSite]:
    site = ScriptSite(canary, ("/content", "/links", "/unsettled", "/popup", "/memory", "/away"))
    yield site
    site.close()


def render_settings(**changes: object) -> Settings:
    """Only the site's address is allowed: the canary's, loopback too, stays refused."""
    base = Settings.from_env({"FETCH_ALLOWLIST": f"{SITE_HOST}/32", "RENDER_DEADLINE_S": "6"})
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def engine() -> Iterator[RenderEngine]:
    settings = render_settings()
    watchdog = Watchdog.start()
    started = RenderEngine(settings, AddressGuard(address_policy(settings)), watchdog).start()
    yield started
    started.close()
    watchdog.stop()
