"""Text from the web is rendered as text: a URL, a title or an error holding <script>,
"><img src=x onerror=...> or a javascript: link never becomes markup or a link. And the
templates keep to the CSP: no inline script or style, no |safe."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from ops.dashboard.config import DashboardSettings
from ops.dashboard.deadletters import Filter
from ops.dashboard.panels import politeness_panel, proxies_panel, render_panel
from ops.dashboard.regions import TEMPLATES, Views, why_not_moving
from ops.dashboard.text import linkable, short_error
from shared.settings import Settings

pytestmark = pytest.mark.unit

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
JS_LINK = "javascript:alert(3)"
HOSTILE_URL = f"http://site.example/{IMG}{SCRIPT}"


class Markup(HTMLParser):
    """The elements and attributes a page really has, as a browser would parse them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [(name, value or "") for name, value in attrs]


def parsed(html: str) -> Markup:
    markup = Markup()
    markup.feed(html)
    return markup


def assert_inert(html: str) -> None:
    markup = parsed(html)
    scripts = [v for k, v in markup.attributes if k == "src" and v.endswith("app.js")]
    assert markup.tags.count("script") == len(scripts) <= 1
    assert "img" not in markup.tags
    assert not [k for k, _ in markup.attributes if k.startswith("on")]
    assert not [
        v for k, v in markup.attributes if k in ("href", "src", "action") and "javascript:" in v.lower()
    ]


def views() -> Views:
    return Views(Settings.from_env({}), DashboardSettings(), get=lambda url: [])


def page_bits(**extra: Any) -> dict[str, Any]:
    meta = {
        "namespace": "crawl",
        "redis_prefix": "crawl",
        "pg_schema": "crawl",
        "read_only": False,
        "auth": False,
        "refresh_s": 2,
        "management_url": "http://127.0.0.1:15672",
    }
    return {
        "meta": meta,
        "csrf": "t",
        "role": "operator",
        "can_act": True,
        "notice": None,
        "stream": None,
        "header": {"workers": 1, "parked": 0},
        "operations": [],
        **extra,
    }


def hostile_dead_letter(**changes: Any) -> dict[str, Any]:
    row = {
        "id": 7,
        "run_id": f"run{SCRIPT}",
        "url": JS_LINK,
        "reason": f"http_500{IMG}",
        "last_error": short_error(f"{SCRIPT}{IMG}\nsecond line"),
        "http_status": 500,
        "attempts": 3,
        "replays": 0,
        "origin_queue": "crawl.bulk",
        "worker_id": IMG,
        "body_bytes": 10,
        "x_death": [{"queue": SCRIPT, "reason": IMG, "count": 1, "exchange": ""}],
        "first_failed_at": None,
        "last_failed_at": None,
        "state": "dead",
        "replayed_at": None,
        "body_sha256": "0" * 64,
        "task": None,
    }
    return {**row, **changes}


def test_a_dead_letter_list_of_hostile_rows_renders_as_text() -> None:
    rows = [hostile_dead_letter(), hostile_dead_letter(id=8, url=HOSTILE_URL)]
    html = views().page(
        "dead_letters.html",
        page_bits(
            filter=Filter(run=SCRIPT),
            rows=rows,
            next_after=None,
            summary=[{"run_id": SCRIPT, "reason": IMG, "count": 2, "max_id": 8}],
        ),
    )
    assert_inert(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    hrefs = [v for k, v in parsed(html).attributes if k == "href"]
    assert JS_LINK not in " ".join(hrefs)
    assert any(h.startswith("http://site.example/") for h in hrefs)  # an http(s) URL is a link...
    assert 'rel="noopener noreferrer nofollow"' in html  # ...that tells the site nothing


def test_a_hostile_dead_letter_detail_renders_as_text() -> None:
    task = {"url": HOSTILE_URL, "queue": "bulk", "priority": 0, "run_id": SCRIPT, "lastmod": IMG}
    for row in (hostile_dead_letter(), hostile_dead_letter(task=task)):
        assert_inert(views().page("dead_letter.html", page_bits(row=row)))


def test_a_hostile_run_page_renders_as_text() -> None:
    run = {
        "run_id": f"r{SCRIPT}",
        "state": "running",
        "enqueued": 3,
        "stored": 1,
        "dead": 1,
        "skipped": 1,
        "left": 0,
        "percent": 100,
        "pages_per_s": 0.0,
        "eta_s": None,
        "producing": False,
        "replayed": 0,
        "held": 0,
        "dead_letters": {IMG: 1},
        "skips": {SCRIPT: 1},
        "identity": {
            "enqueued": 3,
            "stored": 1,
            "dead": 1,
            "skipped": 1,
            "left": 0,
            "accounted": 3,
            "ok": True,
            "held": 0,
            "shared_queues": {},
        },
        "copies": {
            "first": 3,
            "delivered": 3,
            "second": 0,
            "second_acked": 0,
            "second_handled_again": 0,
            "taken_over": 0,
            "republished": 0,
        },
        "activity": {"pages_by_worker": {IMG: 1}},
        "growing": True,
        "proxies": proxies_panel(
            [{"proxy": SCRIPT, "state": "benched", "benched_s": 3.0, "recent_failures": 2}]
        ),
        "politeness": politeness_panel(
            {
                "rate_jitter": 0.2,
                "slowed_domains": [
                    {"domain": IMG, "configured_rps": 2.0, "rps_now": 1.0, "reason": SCRIPT, "since_s": 5.0}
                ],
                "slowed_total": 1,
            }
        ),
        "render": render_panel(
            {f"renders.{SCRIPT}": 2, "renders.ok": 1}, {f"render_{IMG}": 1}, [], "crawl", []
        ),
    }
    errors = [
        {
            "at": None,
            "kind": "dead",
            "url": JS_LINK,
            "reason": IMG,
            "http_status": 500,
            "attempts": 1,
            "worker_id": SCRIPT,
            "error": short_error(SCRIPT),
        }
    ]
    operations = [
        {"id": "op-1", "action": "pause", "state": "done", "progress": IMG, "result": {"paused": True}},
        {"id": "op-2", "action": "resume", "state": "failed", "progress": "", "result": {"error": SCRIPT}},
    ]
    hostile_domains = [
        {
            "domain": SCRIPT,
            "configured_rps": 2.0,
            "observed_per_s": 0.1,
            "in_flight": 1,
            "max_in_flight": 8,
            "pause_left_s": 0.0,
            "next_slot_in_s": 0.2,
            "slow": True,
        }
    ]
    bits = page_bits(
        run=run, errors=errors, why=None, timeline=[], operations=operations, domains=hostile_domains
    )
    html = views().page("run.html", bits)
    assert_inert(html)
    assert "&lt;img src=x onerror=alert(2)&gt;" in html


def test_a_hostile_title_or_error_in_the_runs_list_renders_as_text() -> None:
    row = {
        "run_id": SCRIPT,
        "state": IMG,
        "enqueued": 1,
        "stored": 1,
        "dead": 0,
        "skipped": 0,
        "left": 0,
        "pages_per_s": 0,
        "eta_s": 0,
        "producing": False,
        "last_activity": IMG,
    }
    html = views().page(
        "runs.html",
        page_bits(
            runs=[row],
            activity={
                "window_s": 60,
                "pages_per_s": 0,
                "pages_in_window": 0,
                "top_domains": [{"domain": SCRIPT, "pages": 1}],
                "dead_letters": {IMG: 1},
            },
            queues=[
                {"name": SCRIPT, "role": "work", "exists": True, "ready": 0, "unacked": 0, "consumers": 1}
            ],
        ),
    )
    assert_inert(html)


def test_only_http_and_https_urls_are_links() -> None:
    assert linkable("https://a.example/") and linkable("HTTP://a.example/")
    for url in (JS_LINK, "JaVaScRiPt:alert(1)", "data:text/html,x", "vbscript:x", "//a.example", "", None):
        assert not linkable(url)


def test_error_text_is_one_redacted_line_cut_short() -> None:
    text = short_error("failed at amqp://user:hunter2@broker:5672/\nTraceback...\n" + "x" * 500)
    assert "hunter2" not in text and "\n" not in text
    assert short_error("a" * 500).endswith("…") and len(short_error("a" * 500)) == 200


def template_files() -> list[Path]:
    return sorted(TEMPLATES.rglob("*.html"))


def test_templates_never_mark_data_safe_nor_inline_script_or_style() -> None:
    for path in template_files():
        text = path.read_text(encoding="utf-8")
        assert "|safe" not in text.replace(" ", "") and "Markup(" not in text, path
        assert "autoescape false" not in text, path
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), f"{path}: inline script"
        assert not re.search(r"\sstyle=", text), f"{path}: inline style (the CSP refuses it)"
        assert not re.search(r"\son[a-z]+=", text), f"{path}: an event handler attribute"


def test_the_script_is_our_own_and_small() -> None:
    script = (TEMPLATES.parent / "static" / "app.js").read_text(encoding="utf-8")
    assert len(script.splitlines()) < 80
    assert "eval(" not in script and "innerHTML" not in script


def test_templates_and_static_files_ship_as_package_data() -> None:
    shipped = resources.files("ops.dashboard")
    for name in (
        "templates/base.html",
        "templates/_partials/run_progress.html",
        "static/app.js",
        "static/app.css",
    ):
        assert shipped.joinpath(name).is_file(), name
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"*.html", "*.css", "*.js"' in pyproject


def test_a_run_that_is_not_moving_says_why() -> None:
    base = {
        "pages_per_s": 0.0,
        "left": 5,
        "state": "running",
        "held": 0,
        "workers": [{"worker_id": "w"}],
        "producing": False,
        "identity": {"shared_queues": {"work_ready": 0, "defer_ready": 0}},
    }
    assert why_not_moving({**base, "pages_per_s": 1.0}) is None
    assert str(why_not_moving({**base, "state": "paused", "held": 5})).startswith("paused: 5 URLs")
    assert why_not_moving({**base, "workers": []}) == "no workers are running"
    deferred = {**base, "identity": {"shared_queues": {"work_ready": 0, "defer_ready": 4}}}
    assert str(why_not_moving(deferred)).startswith("everything waits in defer")
    assert str(why_not_moving(base)).startswith("lost: 5 URLs")


def test_only_the_dashboard_imports_the_web_libraries() -> None:
    repo = Path(__file__).resolve().parents[2]
    web = re.compile(r"^\s*(from|import)\s+(starlette|jinja2|uvicorn|sse_starlette)\b", re.MULTILINE)
    for package in ("producer", "worker", "dlq_consumer", "shared", "ops", "demo_site"):
        for path in (repo / package).rglob("*.py"):
            if "dashboard" not in path.relative_to(repo).parts:
                assert not web.search(path.read_text(encoding="utf-8")), path
