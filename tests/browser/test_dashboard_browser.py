"""The dashboard as an operator's browser sees it: pages, live updates without a reload, the
actions with their counts, and the security rules, in chromium."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dlq_consumer import store
from dlq_consumer.replay import replay
from ops.accounting import account
from shared.postgres import db
from tests.browser.conftest import HOSTILE_RUN, Crawl, add_dead_letter, copy_for_docs, screenshot, wait_for
from tests.dashboard_server import Served, served

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

TOKEN = "browser-test-token-" + "t" * 20
LIVE_PAGES = 30  # per host, three hosts at RATE_LIMIT_RPS each: long enough to watch it rise


def fail_on_dialog(page: Page) -> list[str]:
    opened: list[str] = []

    def refuse(dialog: Any) -> None:
        opened.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", refuse)
    return opened


def states(crawl: Crawl, reason: str) -> dict[str, tuple[int, int]]:
    """state → (rows, the highest replay count) of the run's dead letters of `reason`."""
    with db.connect(crawl.settings, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT state, count(*), max(replays) FROM dead_letters WHERE run_id = %s AND reason = %s"
            " GROUP BY state",
            (crawl.run_id, reason),
        ).fetchall()
    return {str(s): (int(n), int(m)) for s, n, m in rows}  # type: ignore[call-overload]


def test_the_runs_page_lists_the_run_and_its_accounting_is_ok(
    page: Page, crawl: Crawl, dashboard: Served
) -> None:
    dialogs = fail_on_dialog(page)
    page.goto("/")
    row = page.locator(f'tr[data-run="{crawl.run_id}"]')
    expect(row.locator("td.acct")).to_have_text(re.compile(rf"{crawl.enqueued} of {crawl.enqueued}: ok$"))
    screenshot(page, "dashboard-runs.png")
    page.locator(f'a:text-is("{crawl.run_id}")').click()
    expect(page.locator("#accounting-badge")).to_contain_text("ok")
    figures = account(crawl.settings, crawl.run_id)
    expect(page.locator("#run-stored")).to_have_text(str(figures.stored))
    for reason, n in figures.dead_by_reason.items():
        expect(page.locator("tr.dead-reason", has_text=reason)).to_contain_text(f"Replay {n}")
    expect(page.locator("#live-status")).to_contain_text("updated")  # the stream is live
    # The politeness panels of a crawl without proxies or jitter, and no render panel or
    # "still growing" mark for a sitemap run that renders nothing.
    expect(page.locator("#run_politeness")).to_contain_text("Proxies")
    expect(page.locator("#run_politeness")).to_contain_text("none configured")
    expect(page.locator("#rate-jitter")).to_have_text(
        "off" if not crawl.settings.rate_jitter else re.compile(r"^\+")
    )
    expect(page.locator("#slowed-total")).to_have_text(re.compile(r"^[0-9]+$"))
    expect(page.locator("#render-done")).to_have_count(0)
    expect(page.locator("#run-growing")).to_have_count(0)
    copy_for_docs(screenshot(page, "dashboard-run.png"), "dashboard-run.png")
    assert dialogs == []


def test_a_run_page_follows_the_crawl_without_a_reload(page: Page, crawl: Crawl, dashboard: Served) -> None:
    from demo_site.config import SiteConfig
    from demo_site.server import DemoSite

    run_id = "browser-live"
    reloads: list[str] = []
    page.on("framenavigated", lambda frame: reloads.append(frame.url) if frame == page.main_frame else None)
    page.goto(f"/runs/{run_id}")
    stored = page.locator("#run-stored")
    expect(stored).to_have_text("0")
    with DemoSite(
        SiteConfig(
            port=0,
            pages_per_host=LIVE_PAGES,
            news_per_host=0,
            flaky_per_host=0,
            broken_per_host=0,
            missing_per_host=0,
            slow_ms=100,
        )
    ) as site:
        producer = crawl.produce(site, run_id)
        try:
            seen = [0]
            for _ in range(2):  # it rises, and rises again, on the page as it was loaded
                # By selector each time: a live update replaces the element.
                page.wait_for_function(
                    "before => parseInt(document.querySelector('#run-stored').textContent) > before",
                    arg=seen[-1],
                    timeout=60_000,
                )
                seen.append(int(stored.text_content() or "0"))
        finally:
            assert producer.wait(timeout=60) == 0
        wait_for(lambda: account(crawl.settings, run_id).accounted >= 3 * LIVE_PAGES, 120, "the live run")
    expect(page.locator("#accounting-badge")).to_contain_text("ok", timeout=30_000)
    assert seen[0] < seen[1] < seen[2]
    assert len(reloads) == 1  # the first load only: every figure since came over the stream
    screenshot(page, "dashboard-run-live.png")


def test_replaying_dead_letters_from_the_page(page: Page, crawl: Crawl, dashboard: Served) -> None:
    dead, _ = states(crawl, "http_500")["dead"]
    page.goto(f"/dead-letters?run={crawl.run_id}&reason=http_500")
    expect(page.locator("tr.dl-row")).to_have_count(dead)
    copy_for_docs(screenshot(page, "dashboard-dead-letters.png"), "dashboard-dead-letters.png")
    page.locator("a", has_text="Replay all matching").click()
    button = page.locator("#confirm-button")
    expect(button).to_have_text(f"Replay {dead} dead letters")
    button.click()
    expect(page.locator(".banner.notice")).to_contain_text("replay")
    # The workers fail them again: back as dead, each with one replay more.
    wait_for(lambda: states(crawl, "http_500") == {"dead": (dead, 1)}, 60, "the replayed URLs to die again")
    page.reload()
    expect(page.locator("tr.dl-row td.replays")).to_have_text(["1"] * dead)


def test_a_stale_confirmation_is_refused_and_a_later_dead_letter_is_left_alone(
    page: Page, crawl: Crawl, dashboard: Served
) -> None:
    dead, _ = states(crawl, "http_404")["dead"]
    confirm = f"/dead-letters/confirm?action=replay&run={crawl.run_id}&reason=http_404"
    page.goto(confirm)
    expect(page.locator("#confirm-button")).to_have_text(f"Replay {dead} dead letters")
    # Meanwhile one of them is replayed from the command line, and is still in flight (the
    # publish goes nowhere, so no worker settles it while the page is open).
    with db.connect(crawl.settings) as conn:
        replay(
            conn,
            lambda _p: None,
            store.Selection(crawl.run_id, "http_404", limit=1),
            crawl.settings.crawl_namespace,
        )
    page.locator("#confirm-button").click()
    expect(page.locator("p.why.bad")).to_contain_text(f"the selection changed: {dead - 1} dead letters now")
    assert page.locator("h1").text_content() == "409"
    page.goto(confirm)
    expect(page.locator("#confirm-button")).to_have_text(f"Replay {dead - 1} dead letters")
    late = "https://late.example/after-the-dry-run"
    with db.connect(crawl.settings) as conn:  # a dead letter that arrives after the count was shown
        add_dead_letter(conn, crawl, late, "http_404")
        conn.commit()
    page.locator("#confirm-button").click()
    expect(page.locator(".banner.notice")).to_contain_text("replay")
    with db.connect(crawl.settings, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state, replays, replayed_at FROM dead_letters WHERE run_id = %s AND url = %s",
            (crawl.run_id, late),
        ).fetchone()
    assert row == ("dead", 0, None)


def test_pause_holds_the_runs_urls_and_resume_gives_them_back(
    page: Page, crawl: Crawl, dashboard: Served
) -> None:
    from demo_site.config import SiteConfig
    from demo_site.server import DemoSite

    run_id = "browser-paused"
    page.goto(f"/runs/{run_id}")
    with DemoSite(
        SiteConfig(
            port=0,
            pages_per_host=20,
            news_per_host=0,
            flaky_per_host=0,
            broken_per_host=0,
            missing_per_host=0,
            slow_ms=100,
        )
    ) as site:
        assert crawl.produce(site, run_id).wait(timeout=60) == 0
        page.locator("button.act-pause").click()
        expect(page.locator("#run-state")).to_have_text("paused", timeout=30_000)
        held = page.locator("#run-held")
        page.wait_for_function(
            "() => parseInt(document.querySelector('#run-held').textContent) > 0", timeout=60_000
        )
        screenshot(page, "dashboard-paused.png")
        page.locator("button.act-resume").click()
        expect(held).to_have_text("0", timeout=60_000)
        wait_for(lambda: account(crawl.settings, run_id).accounted >= 60, 120, "the resumed run")
    expect(page.locator("#run-state")).to_have_text("done", timeout=30_000)


def test_cross_site_posts_login_and_headers(page: Page, crawl: Crawl, dashboard: Served) -> None:
    answers: list[Any] = []
    page.on("response", lambda response: answers.append(response))
    target = f"{dashboard.url}/api/v1/runs/{crawl.run_id}/pause"
    page.set_content(f'<form method="post" action="{target}"><button id="go">go</button></form>')
    with page.expect_navigation():
        page.click("#go")
    assert [a.status for a in answers if a.url == target] == [403]
    with served(crawl.settings, token=TOKEN) as guarded:
        response = page.goto(f"{guarded.url}/runs/{crawl.run_id}")
        assert response is not None and page.url.startswith(f"{guarded.url}/login?next=")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.fill("input[name=token]", "wrong" * 8)
        page.click("button[type=submit]")
        expect(page.locator("p.why.bad")).to_have_text("wrong token")
        page.wait_for_timeout(1100)  # a failed login backs off 1 s (then 2, 4, ... 30)
        page.fill("input[name=token]", TOKEN)
        page.click("button[type=submit]")
        expect(page.locator("#accounting-badge")).to_contain_text("ok")  # back where it was going
        assert page.url == f"{guarded.url}/runs/{crawl.run_id}"


def test_hostile_content_stays_text(page: Page, crawl: Crawl, dashboard: Served) -> None:
    dialogs = fail_on_dialog(page)
    page.goto(f"/dead-letters?run={HOSTILE_RUN}")
    row = page.locator("tr.dl-row")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("<script>alert(1)</script>")
    assert page.locator("main img").count() == 0
    assert row.locator("a[href^='javascript']").count() == 0
    row.locator("a").first.click()
    expect(page.locator("h1")).to_contain_text("Dead letter")
    page.goto(f"/runs/{HOSTILE_RUN}")
    expect(page.locator("table.errors")).to_contain_text('"><img src=x onerror=alert(2)>')
    page.wait_for_timeout(1500)  # a live update or two
    screenshot(page, "dashboard-hostile.png")
    assert dialogs == []


def test_read_only_shows_no_actions_and_refuses_them(page: Page, crawl: Crawl) -> None:
    with served(crawl.settings, read_only=True) as read_only:
        page.goto(f"{read_only.url}/runs/{crawl.run_id}")
        expect(page.locator(".banner.read-only")).to_be_visible()
        assert page.locator("button.act, a.act, form[method=post] button:not(.logout button)").count() == 0
        answer = page.request.post(f"{read_only.url}/api/v1/runs/{crawl.run_id}/pause")
        assert answer.status == 403 and answer.json() == {"error": "the dashboard is read-only"}
        page.goto(f"{read_only.url}/dead-letters?run={crawl.run_id}")
        assert page.locator("a.act, input[type=checkbox]").count() == 0
