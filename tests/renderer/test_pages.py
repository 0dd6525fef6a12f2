"""Each kind of script-built page, rendered by one engine, ends as expected; and the hostile
page's requests, of every kind, reach the canary's address not once."""

from __future__ import annotations

import pytest

from bench.script_site import Canary, ScriptSite
from renderer.engine import RenderEngine
from renderer.page import RenderCrashed, RenderRefused
from renderer.watchdog import Watchdog
from shared.http.netguard import AddressGuard, address_policy
from tests.renderer.conftest import render_settings
from worker.parse.page import parse_page

pytestmark = pytest.mark.timeout(120)


def test_script_built_content_and_links_are_in_the_rendered_page(
    engine: RenderEngine, script_site: ScriptSite
) -> None:
    content = parse_page(engine.render(script_site.url("/content")).html, script_site.url("/content"))
    assert content.h1 == "Built"
    assert "content inserted by a script" in content.text
    links = parse_page(engine.render(script_site.url("/links")).html, script_site.url("/links"))
    assert links.links == (script_site.url("/content"), script_site.url("/popup"))


def test_a_page_that_never_settles_is_read_at_the_deadline(
    engine: RenderEngine, script_site: ScriptSite
) -> None:
    rendered = engine.render(script_site.url("/unsettled"))
    assert not rendered.settled
    assert "never settles" in rendered.html
    assert rendered.render_ms >= 5000  # RENDER_DEADLINE_S=6, the wait for idle bounded by it


def test_popups_are_closed_and_the_page_kept(engine: RenderEngine, script_site: ScriptSite) -> None:
    rendered = engine.render(script_site.url("/popup"))
    assert "opens a popup" in rendered.html
    assert engine.pool is not None and engine.pool.figures.popups_closed >= 1


def test_a_page_allocating_without_end_crashes_alone(engine: RenderEngine, script_site: ScriptSite) -> None:
    with pytest.raises(RenderCrashed):
        engine.render(script_site.url("/memory"))
    assert "content inserted" in engine.render(script_site.url("/content")).html  # the browser goes on


def test_a_page_that_navigates_away_is_read_where_it_went(
    engine: RenderEngine, script_site: ScriptSite
) -> None:
    rendered = engine.render(script_site.url("/away"))
    assert rendered.final_url == script_site.url("/content")
    assert "content inserted by a script" in rendered.html


def test_the_hostile_page_makes_no_connection_to_the_canary(
    engine: RenderEngine, script_site: ScriptSite, canary: Canary
) -> None:
    with pytest.raises(RenderRefused) as refused:
        engine.render(script_site.url("/hostile"))
    assert refused.value.reason == "render_refused"
    assert canary.connections == 0
    assert engine.pool is not None and engine.pool.figures.routed_refusals >= 3


def test_the_proxy_alone_holds_without_the_route_check(script_site: ScriptSite, canary: Canary) -> None:
    settings = render_settings()
    watchdog = Watchdog.start()
    guard = AddressGuard(address_policy(settings))
    engine = RenderEngine(settings, guard, watchdog, route_check=False).start()
    try:
        with pytest.raises(RenderRefused):
            engine.render(script_site.url("/hostile"))
        assert "content inserted" in engine.render(script_site.url("/content")).html
    finally:
        engine.close()
        watchdog.stop()
    assert canary.connections == 0
