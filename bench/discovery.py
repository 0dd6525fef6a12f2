"""make bench's discovery rows: a crawl that follows links, beside Scrapy's CrawlSpider and beside
the same pages read from a sitemap.

    side by side  one host of generated pages with 50 links each (bench/perf_site.py), from
                  /p/0.html at the same depth and scope (host) for both: the URL sets compared,
                  pages/s and whole-machine CPU a page as the other rows count them
    cost          a site of --discovery-pages pages with 50 links each, crawled by discovery to
                  its whole depth and from its sitemap: whole-machine CPU a page (goal: at most
                  15 % more by discovery), the frontier's links seen per second of its own CPU
                  (goal: 20,000), and Redis bytes per URL, each way

Each run has names of its own (queues, keys, schema), removed afterwards, as bench/perf.py's.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.measure import Children, services_cpu_s, services_delta, services_delta_by_name
from bench.perf import (
    Result,
    SiteProcess,
    Table,
    alternate,
    perf_site,
    pipeline_env,
    run_scrapy,
    verdict,
)
from bench.perf_site import link_targets
from ops.accounting import account
from ops.crawl_workers import worker_launches
from ops.teardown import remove_pipeline
from producer.frontier import LINKS_SEEN
from shared.amqp import broker
from shared.amqp.topology import discovery_queue
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import recorded_counters, recorded_enqueued
from shared.settings import Settings

LINKS_PER_PAGE = 50
SIDE_BY_SIDE_PAGES = 2_000
SIDE_BY_SIDE_DEPTH = 2
COST_PAGES = 100_000
WORKERS = 4
CONCURRENCY = 8  # fetches in flight a worker: the CPU-bound rows' figure
QUIET_S = 3.0  # enqueued = accounted, no links waiting, for this long: the crawl is over (a loaded
# machine can keep a frontier on one page for a second)


@dataclass(frozen=True)
class Crawl:
    result: Result
    urls: frozenset[str]
    redis_bytes: int
    links_seen: int
    frontier_cpu_s: float
    # CPU seconds by where they went: our processes by role, the site, and each service
    spent: dict[str, float]


def free_port() -> int:
    """A port nobody listens on at 127.0.1.1 now: other benchmarks' sites take the fixed one."""
    with socket.socket() as probe:
        probe.bind(("127.0.1.1", 0))
        return int(probe.getsockname()[1])


def per_page(crawl: Crawl) -> float:
    """Whole-machine CPU milliseconds a stored page."""
    return 1000 * crawl.result.machine_cpu_s() / crawl.result.pages


def breadth_first(pages: int, depth: int) -> int:
    """Pages a crawl from page 0 reaches to `depth` on the generated site."""
    seen, level = {0}, [0]
    for _ in range(depth):
        following = []
        for page in level:
            for target in link_targets(page, pages, LINKS_PER_PAGE):
                if target not in seen:
                    seen.add(target)
                    following.append(target)
        level = following
    return len(seen)


def full_depth(pages: int) -> int:
    depth = 0
    while breadth_first(pages, depth) < pages:
        depth += 1
    return depth


def run_ours(producer_args: list[str], log_dir: Path, site: SiteProcess, timeout_s: float = 1800) -> Crawl:
    """Workers, the dead-letter consumer and (for --start) the frontier; the producer; then wait
    until every URL enqueued, discovered ones included, is accounted for."""
    name = f"bench{secrets.token_hex(4)}"
    env = pipeline_env(name, CONCURRENCY)
    settings = Settings.from_env(env)
    run_log = log_dir / name
    run_log.mkdir(parents=True)
    children = Children(env, run_log)
    discovering = "--start" in producer_args
    before, site_before = services_cpu_s(), site.cpu_s()
    started = time.monotonic()
    try:
        children.start("dlq_consumer", "-m", "dlq_consumer")
        for launch in worker_launches(WORKERS):
            children.start(launch.name, "-m", "worker", *launch.args)
        if discovering:
            children.start("frontier", "-m", "producer", "--frontier")
        producer = children.start(
            "producer", "-m", "producer", "--run-id", name, *producer_args, stdout=subprocess.PIPE
        )
        assert producer.process.stdout is not None
        producer.process.stdout.read()
        children.reap(producer)
        if producer.exit_code != 0:
            raise RuntimeError(f"producer failed with {producer.exit_code}; see {run_log}")
        _wait_until_over(settings, name, time.monotonic() + timeout_s, run_log)
        elapsed = time.monotonic() - started - (QUIET_S if discovering else 0.0)
        final = account(settings, name)
        urls, redis_bytes, links_seen = _what_it_left(settings, name)
    finally:
        children.stop_all()
        after, site_after = services_cpu_s(), site.cpu_s()
        remove_pipeline(settings)
    frontier_cpu_s = sum(c.cpu_s for c in children.finished if c.name == "frontier")
    spent: dict[str, float] = {}
    for child in children.finished:  # the pool's parent and its workers are all "worker..."
        role = child.name.rstrip("0123456789-.")
        spent[role] = spent.get(role, 0.0) + child.cpu_s
    spent["site"] = site_after - site_before
    services_names = {"beam.smp": "RabbitMQ", "redis-server": "Redis", "postgres": "PostgreSQL"}
    for name, cpu_s in services_delta_by_name(before, after).items():
        service = services_names.get(name, name)
        spent[service] = spent.get(service, 0.0) + cpu_s
    result = Result(
        pages=final.stored,
        elapsed_s=elapsed,
        own_cpu_s=children.cpu_s(),
        services_cpu_s=services_delta(before, after),
        site_cpu_s=site_after - site_before,
    )
    return Crawl(result, urls, redis_bytes, links_seen, frontier_cpu_s, spent)


def _wait_until_over(settings: Settings, run_id: str, deadline: float, run_log: Path) -> None:
    client = connect_redis(settings, OPERATOR)
    connection = broker.connect(settings, "bench discovery")
    quiet_since: float | None = None
    try:
        channel = connection.channel()
        while True:
            enqueued = recorded_enqueued(client, Keys(settings.redis_prefix), run_id)
            accounted = account(settings, run_id).accounted
            waiting = broker.queue_depth(channel, discovery_queue(settings.crawl_namespace))[0]
            if enqueued and accounted >= enqueued and waiting == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= QUIET_S:
                    return
            else:
                quiet_since = None
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out: {accounted} of {enqueued} accounted; see {run_log}")
            time.sleep(0.1)
    finally:
        connection.close()
        client.close()


def _what_it_left(settings: Settings, run_id: str) -> tuple[frozenset[str], int, int]:
    """The stored URLs, the bytes of the run's Redis keys (MEMORY USAGE of each) and the links
    the frontier saw."""
    with psycopg.connect(settings.database_url, options=f"-c search_path={settings.pg_schema}") as conn:
        urls = frozenset(
            str(row[0]) for row in conn.execute("SELECT url FROM pages WHERE run_id = %s", (run_id,))
        )
    client = connect_redis(settings, OPERATOR)
    try:
        keys = Keys(settings.redis_prefix)
        found = [key for key in client.scan_iter(keys.all_pattern(), count=1000) if b":cache:" not in key]
        with client.pipeline(transaction=False) as pipe:
            for key in found:
                pipe.memory_usage(key, samples=0)
            redis_bytes = sum(int(n or 0) for n in pipe.execute())
        links_seen = recorded_counters(client, keys, run_id).get(LINKS_SEEN, 0)
    finally:
        client.close()
    return urls, redis_bytes, links_seen


def run_scrapy_links(
    start: str, depth: int, log_dir: Path, site: SiteProcess
) -> tuple[Result, frozenset[str]]:
    out = log_dir / f"scrapy-links-{secrets.token_hex(3)}.jsonl"
    result = run_scrapy(["--start", start, "--max-depth", str(depth)], log_dir, site=site, out=out)
    with out.open() as lines:
        urls = frozenset(json.loads(line)["url"] for line in lines if line.strip())
    return result, urls


def side_by_side(table: Table, log_dir: Path, rounds: int, pages: int = SIDE_BY_SIDE_PAGES) -> None:
    depth = SIDE_BY_SIDE_DEPTH
    expected = breadth_first(pages, depth)
    port = free_port()
    with perf_site(1, pages, 0, log_dir, port=port, links_per_page=LINKS_PER_PAGE) as site:
        start = f"http://127.0.1.1:{port}/p/0.html"
        ours_urls: list[frozenset[str]] = []
        scrapy_urls: list[frozenset[str]] = []

        def ours() -> Result:
            crawl = run_ours(["--start", start, "--max-depth", str(depth), "--max-pages", "0"], log_dir, site)
            ours_urls.append(crawl.urls)
            return crawl.result

        def scrapy() -> Result:
            result, urls = run_scrapy_links(start, depth, log_dir, site)
            scrapy_urls.append(urls)
            return result

        totals, each = alternate(rounds, {"ours": ours, "scrapy": scrapy})
    same = all(u == scrapy_urls[0] for u in [*ours_urls, *scrapy_urls])
    only_ours = len(ours_urls[0] - scrapy_urls[0])
    only_scrapy = len(scrapy_urls[0] - ours_urls[0])
    table.add(
        f"discovery: URL set, depth {depth}, scope host, {LINKS_PER_PAGE} links a page "
        f"(breadth-first answer {expected})",
        f"{len(ours_urls[0])}",
        f"{len(scrapy_urls[0])}",
        f"{only_ours} only ours, {only_scrapy} only Scrapy's",
        f"the same: {verdict(same and len(ours_urls[0]) == expected)}",
    )
    _compare_rates(table, f"discovery pages/s ({rounds} rounds, ours/Scrapy: {each})", totals)


def _compare_rates(table: Table, label: str, totals: dict[str, Result]) -> None:
    ours, scrapy = totals["ours"], totals["scrapy"]
    table.add(
        label,
        f"{ours.pages_per_s:.0f}",
        f"{scrapy.pages_per_s:.0f}",
        f"{ours.pages_per_s / scrapy.pages_per_s:.2f}x",
    )
    ours_ms = 1000 * ours.machine_cpu_s() / ours.pages
    scrapy_ms = 1000 * scrapy.machine_cpu_s(uses_services=False) / scrapy.pages
    table.add(
        "  discovery whole-machine CPU a page",
        f"{ours_ms:.2f} ms",
        f"{scrapy_ms:.2f} ms",
        f"{ours_ms / scrapy_ms:.2f}x",
    )


def cost(table: Table, log_dir: Path, pages: int = COST_PAGES) -> None:
    depth = full_depth(pages)
    port = free_port()
    # Prebuilt: both crawls of the one site find every page built (the site's CPU is in the figure).
    with perf_site(1, pages, 0, log_dir, port=port, links_per_page=LINKS_PER_PAGE, prebuild=True) as site:
        origin = f"http://127.0.1.1:{port}"
        found = run_ours(
            ["--start", f"{origin}/p/0.html", "--max-depth", str(depth), "--max-pages", "0"], log_dir, site
        )
        listed = run_ours(["--sitemap", f"{origin}/sitemap_index.xml"], log_dir, site)
    ratio = per_page(found) / per_page(listed)
    table.add(
        f"discovery cost: whole-machine CPU a page, {pages} pages x {LINKS_PER_PAGE} links, "
        f"depth {depth} (by discovery / from the sitemap; "
        f"{found.result.pages} and {listed.result.pages} stored)",
        f"{per_page(found):.2f} ms",
        f"{per_page(listed):.2f} ms",
        f"{ratio:.2f}x",
        f"<= 1.15x: {verdict(ratio <= 1.15)}",
    )
    # The services are shared with whatever else runs on the machine: their CPU meanwhile is
    # not all this crawl's. Our own processes and the site are, so this row holds on a busy one.
    own = [
        1000 * (c.result.own_cpu_s + c.result.site_cpu_s) / max(c.result.pages, 1) for c in (found, listed)
    ]
    table.add(
        "  the same, our processes and the site only (RabbitMQ, Redis, PostgreSQL left out)",
        f"{own[0]:.2f} ms",
        f"{own[1]:.2f} ms",
        f"{own[0] / own[1]:.2f}x",
    )
    for where in sorted(set(found.spent) | set(listed.spent)):
        ms = [1000 * c.spent.get(where, 0.0) / max(c.result.pages, 1) for c in (found, listed)]
        table.add(
            f"  of which {where}, CPU a page",
            f"{ms[0]:.2f} ms",
            f"{ms[1]:.2f} ms",
            f"+{ms[0] - ms[1]:.2f} ms",
        )
    table.add(
        "  wall clock, pages/s (by discovery / from the sitemap)",
        f"{found.result.elapsed_s:.0f} s, {found.result.pages_per_s:.0f}/s",
        f"{listed.result.elapsed_s:.0f} s, {listed.result.pages_per_s:.0f}/s",
    )
    rate = found.links_seen / found.frontier_cpu_s if found.frontier_cpu_s else 0.0
    table.add(
        f"frontier links seen a second of its CPU ({found.links_seen} links, {found.frontier_cpu_s:.1f} s)",
        f"{rate:,.0f}",
        "",
        "",
        f">= 20,000: {verdict(rate >= 20_000)}",
    )
    table.add(
        "Redis bytes a URL, the run's keys (by discovery / from the sitemap)",
        f"{found.redis_bytes / max(found.result.pages, 1):.0f}",
        f"{listed.redis_bytes / max(listed.result.pages, 1):.0f}",
    )
