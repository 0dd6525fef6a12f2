"""The whole pipeline as separate processes against the demo site: every URL accounted for."""

from __future__ import annotations

import collections
import io
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench.measure import free_port_block
from demo_site.config import Kind
from demo_site.server import DemoSite
from ops.accounting import account
from ops.crawl import Processes, run_crawl
from shared.postgres import db
from shared.settings import Settings
from tests.e2e.conftest import service_env

pytestmark = pytest.mark.timeout(300)


def rows(settings: Settings, query: str, *params: object) -> list[tuple[object, ...]]:
    with db.connect(settings, autocommit=True) as conn:
        return list(conn.execute(query, params))


def pairs(found: list[tuple[object, ...]]) -> dict[object, object]:
    """Rows of two columns as a dict of the first to the second."""
    return {key: value for key, value in found}


def requests_per_path(site: DemoSite) -> collections.Counter[str]:
    return collections.Counter(record.path for record in site.records() if record.method == "GET")


def crawl(
    settings: Settings,
    site: DemoSite,
    run_id: str,
    tmp_path: Path,
    workers: int = 3,
    *,
    separate_workers: bool = False,
    **env: str,
) -> tuple[int, str]:
    out = io.StringIO()
    code = run_crawl(
        settings,
        ["--sitemap", site.config.sitemap_index_url],
        workers,
        run_id,
        service_env(settings, **env),
        tmp_path / "logs",
        240,
        out,
        separate_workers=separate_workers,
    )
    return code, out.getvalue()


def test_every_url_ends_stored_or_dead_exactly_once(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    expected = demo_site.config.expected()
    code, output = crawl(settings, demo_site, "e2e-main", tmp_path)
    assert code == 0, output

    a = account(settings, "e2e-main")
    assert a.accounted == expected.unique_total
    assert f"duplicates        {expected.duplicates:6d}" in output

    stored = {str(url) for (url,) in rows(settings, "SELECT url FROM pages WHERE run_id = %s", "e2e-main")}
    assert stored == set(expected.normal) | set(expected.flaky)
    dead = pairs(rows(settings, "SELECT url, reason FROM dead_letters WHERE run_id = %s", "e2e-main"))
    assert dead == {
        **dict.fromkeys(expected.broken, "http_500"),
        **dict.fromkeys(expected.missing, "http_404"),
    }

    # Fail-twice pages were stored on their third attempt.
    attempts = pairs(rows(settings, "SELECT url, failed_attempts FROM pages WHERE run_id = %s", "e2e-main"))
    assert {attempts[url] for url in expected.flaky} == {2}
    # Always-500 pages were fetched exactly three times, 404s exactly once, good pages once.
    fetched = requests_per_path(demo_site)
    config = demo_site.config
    for n in range(1, config.broken_per_host + 1):
        assert fetched[config.path(Kind.BROKEN, n)] == 3 * len(config.hosts)
    for n in range(1, config.missing_per_host + 1):
        assert fetched[config.path(Kind.MISSING, n)] == len(config.hosts)
    assert fetched[config.path(Kind.PAGE, 1)] == len(config.hosts)
    dead_attempts = pairs(
        rows(settings, "SELECT url, attempts FROM dead_letters WHERE run_id = %s", "e2e-main")
    )
    assert {dead_attempts[url] for url in expected.broken} == {3}
    assert {dead_attempts[url] for url in expected.missing} == {1}

    # Fields parsed from the page made it to the row.
    title, lang, h1, links = rows(
        settings,
        "SELECT title, lang, h1, jsonb_array_length(links) FROM pages WHERE url = %s",
        expected.normal[0],
    )[0]
    assert title and h1 and lang == "en" and isinstance(links, int) and links > 0


def test_replaying_dead_letters_after_the_site_is_fixed_stores_them(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    expected = demo_site.config.expected()
    code, output = crawl(settings, demo_site, "e2e-replay", tmp_path, workers=2)
    assert code == 0, output
    demo_site.fix()

    env = service_env(settings)
    procs = Processes(tmp_path / "replay-logs", env)
    (tmp_path / "replay-logs").mkdir()
    procs.start("worker", "worker")
    procs.start("dlq_consumer", "dlq_consumer")
    try:
        replay = subprocess.run(
            [sys.executable, "-m", "dlq_consumer", "replay", "--run", "e2e-replay", "--reason", "http_500"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert replay.returncode == 0, replay.stderr
        deadline = time.monotonic() + 60
        while account(settings, "e2e-replay").stored < len(expected.normal) + len(expected.flaky) + len(
            expected.broken
        ):
            assert time.monotonic() < deadline, "replayed URLs were not stored in time"
            procs.check_alive()
            time.sleep(0.25)
    finally:
        codes = procs.stop_all()
    assert set(codes.values()) == {0}
    a = account(settings, "e2e-replay")
    assert a.dead_by_reason == {"http_404": len(expected.missing)}
    replayed = rows(
        settings, "SELECT count(*) FROM dead_letters WHERE run_id = %s AND state = 'replayed'", "e2e-replay"
    )
    assert replayed == [(len(expected.broken),)]


def test_a_rate_limited_domain_loses_no_url(settings: Settings, demo_site: DemoSite, tmp_path: Path) -> None:
    # A low rate and almost no inline waiting: most URLs are held in the workers, their slots
    # reserved, while they wait.
    expected = demo_site.config.expected()
    code, output = crawl(
        settings, demo_site, "e2e-slow", tmp_path, workers=2, RATE_LIMIT_RPS="4", MAX_INLINE_WAIT_S="0.1"
    )
    assert code == 0, output
    a = account(settings, "e2e-slow")
    assert a.accounted == expected.unique_total
    assert a.stored == len(expected.normal) + len(expected.flaky)


def test_a_recrawl_fetches_nothing_the_sitemap_says_is_unchanged(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    config = demo_site.config
    expected = config.expected()
    code, output = crawl(settings, demo_site, "e2e-first", tmp_path, workers=2)
    assert code == 0, output
    before = len(demo_site.records())

    out = io.StringIO()
    code = run_crawl(
        settings,
        ["--sitemap", config.sitemap_index_url, "--recrawl-of", "e2e-first"],
        2,
        "e2e-again",
        service_env(settings),
        tmp_path / "again",
        240,
        out,
    )
    assert code == 0, out.getvalue()

    # Due again: pages whose sitemap entry has no lastmod (the priority pages), and URLs the first
    # run did not store (always-500 and 404). Everything else has a lastmod older than its fetch.
    due = set(expected.priority) | set(expected.broken) | set(expected.missing)
    again = account(settings, "e2e-again")
    assert again.accounted == len(due)
    assert again.stored == len(expected.priority)
    fetched_paths = {r.path for r in demo_site.records()[before:] if r.path.endswith(".html")}
    assert fetched_paths == {urlsplit(url).path for url in due}
    unchanged = rows(settings, "SELECT DISTINCT unchanged FROM pages WHERE run_id = %s", "e2e-again")
    assert unchanged == [(True,)]


def test_an_extraction_profile_fills_its_fields_on_the_demo_site(
    settings: Settings, demo_site: DemoSite, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        '[[profile]]\nname = "news"\nurl_pattern = "/news/"\n\n[profile.fields]\n'
        'headline = { css = "h1" }\nlanguage = { css = "html", attr = "lang" }\n'
        'links = { css = "a", attr = "href", all = true }\n'
    )
    code, output = crawl(
        settings, demo_site, "e2e-profile", tmp_path, workers=2, EXTRACTION_PROFILES_FILE=str(profiles)
    )
    assert code == 0, output
    found = rows(settings, "SELECT url, profile, extracted, h1 FROM pages WHERE run_id = %s", "e2e-profile")
    news = [(url, profile, extracted, h1) for url, profile, extracted, h1 in found if "/news/" in str(url)]
    assert len(news) == len(demo_site.config.expected().news)
    for _, profile, extracted, h1 in news:
        assert profile == "news"
        assert isinstance(extracted, dict)
        assert extracted["headline"] == h1 and extracted["language"] == "en" and extracted["links"]
    assert {profile for url, profile, _, _ in found if "/news/" not in str(url)} == {None}


@pytest.mark.parametrize("separate", [False, True], ids=["pool", "separate-workers"])
def test_a_metrics_port_gives_each_process_of_the_crawl_a_port_of_its_own(
    settings: Settings, demo_site: DemoSite, tmp_path: Path, separate: bool
) -> None:
    # Dead-letter consumer, producer, then the pool at +10 with its second worker at +11, or
    # separate workers at +10 and +20.
    base = free_port_block(21)
    expected = demo_site.config.expected()
    code, output = crawl(
        settings,
        demo_site,
        "e2e-ports",
        tmp_path,
        workers=2,
        separate_workers=separate,
        METRICS_PORT=str(base),
        METRICS_LINGER_S="60",
    )
    assert code == 0, output  # before, the producer exited 2: its port was the consumer's
    workers = (
        f"worker-1 {base + 10}, worker-2 {base + 20}" if separate else f"worker-pool {base + 10}-{base + 11}"
    )
    assert f"metrics on 127.0.0.1: dlq_consumer {base}, producer {base + 1}, {workers}" in output
    assert account(settings, "e2e-ports").accounted == expected.unique_total
    logs = tmp_path / "logs"
    last_worker = (base + 20, "worker-2") if separate else (base + 11, "worker-pool")
    assert (
        f"serving metrics on http://127.0.0.1:{last_worker[0]}/metrics"
        in (logs / f"{last_worker[1]}.log").read_text()
    )
    assert "until scraped" not in (logs / "producer.log").read_text()  # it did not linger
