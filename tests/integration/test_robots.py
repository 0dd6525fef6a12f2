"""robots.txt end to end: real handlers, Redis and PostgreSQL against a local logged site."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from bench.site import Answer, Hit, LoggedSite, Route, pages_route
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from tests.integration.test_politeness import crawl_in_threads, rows
from tests.pacing import most_over_pace, typical_gap_s


def robots_route(robots: Answer) -> Route:
    def route(hit: Hit) -> Answer:
        return robots if hit.path == "/robots.txt" else pages_route(hit)

    return route


def text(body: str) -> Answer:
    return Answer(200, body.encode(), {"Content-Type": "text/plain"})


@pytest.fixture
def polite(settings: Settings) -> Iterator[Settings]:
    db.ensure_schema(settings)
    yield dataclasses.replace(settings, rate_limit_rps=20.0, max_attempts=3)


@pytest.mark.timeout(60)
def test_disallowed_paths_are_never_requested_and_recorded_as_skips(polite: Settings) -> None:
    route = robots_route(text("User-agent: *\nDisallow: /private/\n"))
    with LoggedSite(route) as site:
        public = [site.url(f"/public/{n}") for n in range(6)]
        private = [site.url(f"/private/{n}") for n in range(6)]
        report = crawl_in_threads(polite, [*public, *private], threads=4, run_s=30)
        paths = [hit.path for hit in site.hits]
        domain = site.domains()[0]
    assert not [path for path in paths if path.startswith("/private/")]
    assert paths.count("/robots.txt") == 1  # once for all four threads
    assert sorted(report.done) == sorted(public + private)
    skips = rows(polite, "SELECT url, reason FROM skips WHERE run_id = 'r1' ORDER BY url")
    assert skips == [(url, "robots") for url in sorted(private)]
    stored = rows(polite, "SELECT url FROM pages WHERE run_id = 'r1' ORDER BY url")
    assert stored == [(url,) for url in sorted(public)]
    client = connect_redis(polite, OPERATOR)
    ttl_ms = client.pttl(Keys(polite.redis_prefix).robots(domain))
    client.close()
    assert 0 < ttl_ms <= polite.robots_ttl_s * 1000  # shared with every worker, for the TTL


@pytest.mark.timeout(60)
def test_crawl_delay_spaces_the_requests(polite: Settings) -> None:
    route = robots_route(text("User-agent: *\nCrawl-delay: 0.5\n"))
    with LoggedSite(route) as site:
        crawl_in_threads(polite, [site.url(f"/p/{n}") for n in range(8)], threads=3, run_s=60)
        starts = sorted(hit.at for hit in site.hits if hit.path != "/robots.txt")
    assert len(starts) == 8
    # 20 req/s configured, 2 allowed. Judged over the whole run, with a request's lateness on
    # a loaded machine allowed once (tests/pacing.py), not gap by gap: at the configured 20/s
    # the 8 requests would run 4 ahead of what 2/s lets through in their 0.4 s.
    assert most_over_pace(starts, 1 / 0.5) <= 0, starts
    # Most gaps near the delay (0.525 s with the gate's headroom), far from the rate's 0.05 s;
    # a fifth is left for the jitter of arrivals the clearances do not see.
    assert typical_gap_s(starts) >= 0.8 * 0.5, starts


@pytest.mark.timeout(60)
def test_robots_txt_404_allows_everything(polite: Settings) -> None:
    route = robots_route(Answer(404, b"", {"Content-Type": "text/plain"}))
    with LoggedSite(route) as site:
        report = crawl_in_threads(polite, [site.url("/anything")], threads=1, run_s=10)
    assert report.done == [site.url("/anything")]
    assert rows(polite, "SELECT count(*) FROM pages") == [(1,)]


@pytest.mark.timeout(60)
def test_robots_txt_5xx_keeps_the_url_off_the_site_then_dead_letters_it(polite: Settings) -> None:
    route = robots_route(Answer(500, b"oops", {"Content-Type": "text/plain"}))
    with LoggedSite(route) as site:
        report = crawl_in_threads(polite, [site.url("/page")], threads=1, run_s=20)
        paths = [hit.path for hit in site.hits]
    assert report.dead == [site.url("/page")]
    assert report.deferred_or_retried == polite.max_attempts - 1  # retried, not dropped
    assert "/page" not in paths
    assert paths.count("/robots.txt") == 1  # the failure is remembered, not asked for again


@pytest.mark.timeout(60)
def test_respect_robots_off_fetches_no_robots_txt(polite: Settings) -> None:
    route = robots_route(text("User-agent: *\nDisallow: /\n"))
    with LoggedSite(route) as site:
        settings = dataclasses.replace(polite, respect_robots=False)
        report = crawl_in_threads(settings, [site.url("/page")], threads=1, run_s=10)
        paths = [hit.path for hit in site.hits]
    assert paths == ["/page"] and report.done == [site.url("/page")]
