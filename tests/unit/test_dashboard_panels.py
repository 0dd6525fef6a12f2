"""The run page's panels as view-models: proxy health, jitter and slowed domains, the render
figures, and a discovery run's total marked as still growing; and their markup."""

from __future__ import annotations

from typing import Any

import pytest

from ops.dashboard import panels
from ops.dashboard.config import DashboardSettings
from ops.dashboard.panels import politeness_panel, proxies_panel, render_panel, still_growing
from ops.dashboard.regions import Views
from renderer import figures
from shared.settings import Settings
from worker.handling import render_figures

pytestmark = pytest.mark.unit

NS = "crawl"


def queue(name: str, ready: int, unacked: int = 0) -> dict[str, Any]:
    return {"name": name, "role": "work", "exists": True, "ready": ready, "unacked": unacked, "consumers": 1}


def test_proxies_are_ok_or_failing_and_counted() -> None:
    panel = proxies_panel(
        [
            {"proxy": "socks5h://127.0.0.1:1080", "state": "usable", "benched_s": 0.0, "recent_failures": 1},
            {"proxy": "http://127.0.0.1:3128", "state": "benched", "benched_s": 25.0, "recent_failures": 4},
        ]
    )
    assert panel is not None
    assert [(r["proxy"], r["state"]) for r in panel["rows"]] == [
        ("socks5h://127.0.0.1:1080", "ok"),
        ("http://127.0.0.1:3128", "failing"),
    ]
    assert (panel["usable"], panel["total"]) == (1, 2)
    assert proxies_panel([]) is None and proxies_panel(None) is None
    unreadable = proxies_panel({"error": "PROXY_FILE: /x: no such file"})
    assert unreadable is not None and unreadable["error"] == "PROXY_FILE: /x: no such file"


def test_politeness_shows_the_jitter_and_counts_the_slowed_domains_not_listed() -> None:
    slowed = [{"domain": "a.example", "configured_rps": 2.0, "rps_now": 0.5, "reason": "429", "since_s": 3.0}]
    panel = politeness_panel({"rate_jitter": 0.25, "slowed_domains": slowed, "slowed_total": 21})
    assert panel == {"jitter": 0.25, "slowed": slowed, "slowed_total": 21, "more": 20}
    assert politeness_panel(None) is None


def test_render_figures_from_the_runs_counters_dead_letters_queue_and_renderers() -> None:
    counters = {
        "renders.ok": 40,
        "renders.unsettled": 2,
        "renders.render_timeout": 3,
        "renders.render_refused": 1,
        "renders.http_404": 4,
        "render_ms": 50 * 1200,
        "sent_to_render.script_shell": 7,
        "enqueued.render": 30,
        "enqueued.bulk": 100,
    }
    workers: list[dict[str, Any]] = [
        {"worker_id": "r1", "browser_restarts": 2},
        {"worker_id": "r2", "browser_restarts": 1},
        {"worker_id": "w1"},
    ]
    panel = render_panel(
        counters, {"render_timeout": 1, "http_404": 4}, [queue(f"{NS}.render", 5, 2)], NS, workers
    )
    assert panel is not None
    assert (panel["renders"], panel["done"], panel["failed"]) == (50, 42, 8)
    assert (panel["timeouts"], panel["refused"], panel["crashed"], panel["unsettled"]) == (3, 1, 0, 2)
    assert panel["mean_ms"] == 1200
    assert panel["sent"] == {"routing rule": 30, "auto: script_shell": 7}
    assert panel["dead"] == {"render_timeout": 1}
    assert panel["depth"] == {"ready": 5, "unacked": 2} and panel["queue"] == f"{NS}.render"
    assert panel["browser_restarts"] == 3 and panel["renderers_reporting"] == 2


def test_the_counter_names_are_those_the_renderer_and_the_worker_write() -> None:
    assert (panels.RENDERS_PREFIX, panels.RENDER_MS) == (figures.RENDERS_PREFIX, figures.RENDER_MS_FIELD)
    assert panels.SENT_TO_RENDER == render_figures.SENT_PREFIX


def test_no_render_panel_for_a_run_that_renders_nothing_but_one_while_its_queue_holds_some() -> None:
    assert render_panel({"enqueued.bulk": 9}, {"http_500": 1}, [queue(f"{NS}.render", 0)], NS, []) is None
    waiting = render_panel({}, {}, [queue(f"{NS}.render", 4)], NS, None)
    assert waiting is not None and waiting["renders"] == 0 and waiting["mean_ms"] is None
    assert waiting["browser_restarts"] is None  # no renderer says: not shown as 0


def test_a_discovery_run_grows_while_links_wait_or_urls_are_left() -> None:
    links_waiting = [queue(f"{NS}.discovery", 0, 3)]
    assert still_growing(True, "running", 0, links_waiting, NS)
    assert still_growing(True, "running", 5, [], NS)
    assert not still_growing(True, "done", 0, [queue(f"{NS}.discovery", 0)], NS)
    assert not still_growing(True, "cancelled", 5, links_waiting, NS)
    assert not still_growing(False, "running", 5, links_waiting, NS)  # a sitemap run's total is known


def run_context(**panels: Any) -> dict[str, Any]:
    run = {
        "run_id": "r1",
        "state": "running",
        "enqueued": 10,
        "stored": 4,
        "dead": 0,
        "skipped": 0,
        "left": 6,
        "percent": 40,
        "pages_per_s": 1.5,
        "eta_s": 4.0,
        "producing": False,
        "growing": False,
        "replayed": 0,
        "held": 0,
        "proxies": None,
        "politeness": None,
        "render": None,
        **panels,
    }
    return {"run": run, "root": ""}


def render(template: str, ctx: dict[str, Any]) -> str:
    views = Views(Settings.from_env({}), DashboardSettings(), get=lambda url: [])
    return views.env.get_template(f"_partials/{template}.html").render(ctx)


def test_the_progress_says_a_growing_total_and_a_lower_bound_eta() -> None:
    growing = render("run_progress", run_context(growing=True))
    assert "total still growing" in growing and 'ETA <b id="run-eta">&gt;' in growing
    assert "so far" in growing
    settled = render("run_progress", run_context())
    assert "still growing" not in settled and "&gt;" not in settled


def test_the_markup_of_the_proxy_politeness_and_render_panels() -> None:
    ctx = run_context(
        proxies=proxies_panel(
            [{"proxy": "http://127.0.0.1:3128", "state": "benched", "benched_s": 25.0, "recent_failures": 4}]
        ),
        politeness=politeness_panel({"rate_jitter": 0.2, "slowed_domains": [], "slowed_total": 0}),
        render=render_panel(
            {"renders.ok": 3, "renders.render_timeout": 1}, {}, [queue(f"{NS}.render", 2)], NS, []
        ),
    )
    html = render("run_politeness", ctx)
    assert 'id="proxies-usable">0</b> of 1 ok' in html and "proxy-failing" in html and "25 s" in html
    assert 'id="rate-jitter">+20%</b>' in html and 'id="slowed-total">0</b>' in html
    html = render("run_render", ctx)
    assert 'id="render-done">3</b>' in html and 'id="render-timeouts">1</b>' in html
    assert 'id="render-queue">2</b>' in html and 'id="render-restarts">not reported</b>' in html
    assert render("run_render", run_context()).strip() == ""
    assert "none configured" in render("run_politeness", run_context())
