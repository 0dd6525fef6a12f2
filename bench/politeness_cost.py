"""python -m bench.politeness_cost: what waiting for a polite slot costs the machine.

Crawls --pages pages of one loopback host at --rate requests/s with --workers workers laid out as
`make crawl` lays them out (ops/crawl_workers.py: one pool of that many processes, each with
FETCH_CONCURRENCY fetches in flight, the default unless the environment sets it), until every
page is stored, then prints per run:

    wall time, requests/s and the most requests in any 1-s window of the site's own log;
    CPU-seconds a page: the workers + the producer + RabbitMQ (beam) + Redis + PostgreSQL
      (the services are shared, so their share is noisy; ours is exact); and the same net of
      what the services spend with nothing running (measured for IDLE_WINDOW_S before each
      crawl, then prorated): RabbitMQ alone idles at a few ms a second, which a crawl of
      100 s at 2 pages/s would otherwise count as a couple of ms a page; then the services'
      share by service, Redis round trips a page (the server's read events, all clients), and
      what the bench's own polling for the last page cost PostgreSQL, left out of the above;
    broker publishes a page: the producer's one per URL plus every deferral and retry the
      workers counted (their metrics), so 1.0 is each URL published once and never deferred;
      deliveries a page: messages the workers took from the broker, redeliveries included;
    one idle-waiting worker's CPU: a worker whose every prefetched URL waits for a slot
      (--idle-rate), over --idle-window seconds;
    whether RabbitMQ's management plugin answers: its statistics add to the machine's figure.

Run with `--rate 0` for the unbound crawl to compare with (RATE_LIMIT_RPS=1000), or with
`--with-unbound` to crawl the same pages unbound right after each polite crawl, with as many
workers, and print the ratios of each pair: an unbound crawl of 200 pages lasts a couple of
seconds, so its figure is noisy, and pairs in the same minutes are the fairest comparison.
`--latency-ms 100` has the site answer each page that late: with `--rate 0` the crawl is then
bound by the domain's concurrency cap (MAX_CONCURRENT_PER_DOMAIN, 8 in flight), the other way
politeness binds. `--real-pages` serves real pages instead of the small synthetic ones: the
first --pages of the Python documentation's 530 (bench/real_corpus.py, fetched by the bench),
the pages users meet. `--bench-pages` serves the ~6-KB pages `make bench` generates
(bench/perf_site.py), between the two. `--repeat N` runs every crawl N times. Every run uses fresh names and
removes its queues, keys and schema.

`--with-scrapy` has Scrapy crawl the same pages after each of our crawls (bench/scrapy_run.py: the
extraction `make bench` gives it, robots.txt obeyed, MAX_CONCURRENT_PER_DOMAIN requests in flight
at most, DOWNLOAD_DELAY without jitter at the spacing our limiter keeps, 1.05/rate), and prints
its polite page against its unbound one beside ours. A process that lives for one crawl counts
whole, start-up included: Scrapy's, as our producer's; the services and our workers, which outlive
a crawl, count from its start. The services' CPU over Scrapy's crawl counts as it does over ours
(they serve Scrapy nothing: that is their idle spend).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from psycopg import sql

from bench.measure import (
    children_of,
    free_port_block,
    proc_cpu_s,
    services_cpu_s,
    services_delta,
    services_delta_by_name,
)
from bench.perf_site import page_html
from bench.politeness import cleanup, wait_for_consumers, wait_for_first_hit
from bench.real_corpus import CorpusUnavailable, ensure_corpus, page_paths
from bench.site import Answer, Hit, LoggedSite, Route, most_in_any_window, pages_route
from ops import management
from ops.crawl_workers import worker_launches
from shared.amqp import broker
from shared.amqp.topology import dead_letter_queue
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.settings import Settings
from worker.politeness.gate import RATE_HEADROOM

UNBOUND_RPS = 1000.0
DONE_TIMEOUT_S = 900.0
IDLE_WINDOW_S = 15.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.politeness_cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workers", default="3,12", help="comma-separated worker counts (default 3,12)")
    parser.add_argument("--pages", type=int, default=200, help="pages of the one host (default 200)")
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument(
        "--real-pages",
        action="store_true",
        help="serve real pages (bench/real_corpus.py, at most its 530) instead of the small synthetic ones",
    )
    kinds.add_argument(
        "--bench-pages",
        action="store_true",
        help="serve the pages `make bench` generates (bench/perf_site.py, about 6 KB, 20 links each) "
        "instead of the small synthetic ones",
    )
    parser.add_argument("--rate", type=float, default=2.0, help="RATE_LIMIT_RPS; 0 = unbound (default 2)")
    parser.add_argument(
        "--idle-rate", type=float, default=0.05, help="rate for the idle-worker run (0 = skip)"
    )
    parser.add_argument("--idle-window", type=float, default=20.0, help="seconds the idle worker is measured")
    parser.add_argument(
        "--with-unbound", action="store_true", help="after each crawl, the same unbound, and the ratios"
    )
    parser.add_argument(
        "--with-scrapy", action="store_true", help="after each crawl, Scrapy on the same pages and settings"
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="the site answers each page this late (default 0); with --rate 0 and 100, the crawl "
        "is bound by MAX_CONCURRENT_PER_DOMAIN instead",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of every crawl (default 1)")
    parser.add_argument("--log-dir", default="", help="keep the processes' logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    args.worker_counts = [int(n) for n in args.workers.split(",") if n.strip()]
    if (
        args.pages < 1
        or args.rate < 0
        or args.latency_ms < 0
        or not args.worker_counts
        or min(args.worker_counts) < 1
    ):
        parser.error("need --pages >= 1, --rate >= 0, --latency-ms >= 0 and worker counts >= 1")
    if args.repeat < 1:
        parser.error("need --repeat >= 1")
    if args.with_unbound and args.rate == 0:
        parser.error("--with-unbound compares a rate-limited crawl with an unbound one: give --rate > 0")
    return args


def tree_cpu_s(pid: int) -> float:
    """utime + stime of a process and its children now running: a pool and its workers."""
    return proc_cpu_s(pid) + sum(proc_cpu_s(child) for child in children_of(pid))


@dataclass
class Result:
    label: str
    wall_s: float
    requests: int
    worst_window: int
    ours_cpu_s: float
    services_cpu_s: float
    services_idle_cpu_s: float  # what the services spend idle over the same span
    publishes: int
    deferrals: int
    deliveries: int
    services_by_name: dict[str, float] = field(default_factory=dict)  # the services' CPU-s, split
    redis_reads: int = 0  # read events Redis processed: its clients' round trips, about
    through_broker: bool = True  # False for Scrapy, which publishes nothing
    polling_cpu_s: float = 0.0  # PostgreSQL's CPU for the bench's polling: left out of the services'
    dead_letters: int = 0  # pages dead-lettered instead of stored (a real page over the parse budget)

    def cpu_s_parts(self) -> tuple[float, float, float]:
        """CPU-seconds of the crawl: ours, the whole machine's, and the whole machine's net of
        what the services spend idle."""
        machine = self.ours_cpu_s + self.services_cpu_s
        return self.ours_cpu_s, machine, machine - self.services_idle_cpu_s

    def ratios(self, other: Result) -> tuple[float, float, float]:
        """This crawl's CPU against `other`'s, a crawl of as many pages: ours, the machine's,
        the machine's net of idle."""
        mine, theirs = self.cpu_s_parts(), other.cpu_s_parts()
        ours, machine, net = (a / b if b > 0 else math.inf for a, b in zip(mine, theirs, strict=True))
        return ours, machine, net

    def row(self, pages: int) -> str:
        ours_ms, machine_ms, net_ms = (1000 * cpu_s / pages for cpu_s in self.cpu_s_parts())
        return (
            f"{self.label:<18} {self.wall_s:>7.1f} {self.requests / self.wall_s:>6.2f} "
            f"{self.worst_window:>6} "
            f"{ours_ms:>9.1f} {machine_ms:>10.1f} {net_ms:>8.1f} " + self.broker_columns(pages)
        )

    def broker_columns(self, pages: int) -> str:
        if not self.through_broker:
            return f"{'-':>9} {'-':>9} {'-':>7}"
        return f"{self.publishes / pages:>9.2f} {self.deliveries / pages:>9.2f} {self.deferrals:>7}"

    def services_row(self, pages: int) -> str:
        """Where the services' share went, in ms a page, idle spend included."""
        names = {"beam.smp": "RabbitMQ", "redis-server": "Redis", "postgres": "PostgreSQL"}
        parts = ", ".join(
            f"{names.get(name, name)} {1000 * cpu_s / pages:.2f}"
            for name, cpu_s in sorted(self.services_by_name.items())
        )
        return (
            f"{'':<18} services ms/page: {parts}; idle share {1000 * self.services_idle_cpu_s / pages:.2f}; "
            f"Redis round trips/page {self.redis_reads / pages:.1f}; "
            f"the bench's polling of PostgreSQL (left out) {1000 * self.polling_cpu_s / pages:.2f}"
            + (f"; dead-lettered {self.dead_letters} of {pages}" if self.dead_letters else "")
        )


HEADER = (
    f"{'run':<18} {'wall s':>7} {'req/s':>6} {'max/1s':>6} {'ours ms/p':>9} {'machine ms/p':>10} "
    f"{'net ms/p':>8} "
    f"{'publ/page':>9} {'deliv/page':>9} {'deferred':>7}"
)


def start_workers(
    env: dict[str, str], count: int, log_dir: Path, tag: str
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """`count` workers as `make crawl` starts them; the processes started, and every worker's
    metrics port (a pool's worker n serves on its pool's port + n)."""
    db.ensure_schema(Settings.from_env(env))  # once, before workers that start together race to make it
    workers: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    for launch in worker_launches(count):
        base = free_port_block(launch.processes)
        log = (log_dir / f"{tag}-{launch.name}.log").open("wb")
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "worker", *launch.args],
                env={**env, "METRICS_PORT": str(base)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        ports += range(base, base + launch.processes)
    return workers, ports


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=40)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@dataclass(frozen=True)
class SitePages:
    """What the one host serves: the paths a crawl asks for, and how the site answers."""

    paths: list[str]
    route: Route
    dead_letters_possible: bool = False  # a page may be dead-lettered (over the parse budget)

    @classmethod
    def synthetic(cls, count: int) -> SitePages:
        """Small pages (bench/site.py's, about 300 bytes) at /p/0 ... /p/<count - 1>."""
        return cls([f"/p/{n}" for n in range(count)], pages_route)

    @classmethod
    def generated(cls, count: int) -> SitePages:
        """The pages `make bench` crawls (bench/perf_site.py: about 6 KB, a title, a description,
        a canonical link, headings, paragraphs and 20 links) at /p/0.html ... /p/<count - 1>.html."""
        return cls([f"/p/{n}.html" for n in range(count)], generated_route(count))

    @classmethod
    def real(cls, count: int) -> SitePages:
        """The first `count` pages of the real corpus, a fair mix of sizes (bench/real_corpus.py)."""
        root = ensure_corpus()
        paths = page_paths(root)
        if count > len(paths):
            raise SystemExit(f"--pages {count}: the real corpus at {root} has {len(paths)} pages")
        bodies = {path: (root / path.lstrip("/")).read_bytes() for path in paths[:count]}
        return cls(list(bodies), corpus_route(bodies), dead_letters_possible=True)

    def answered_late(self, latency_s: float) -> Route:
        """The site's answers, every page but robots.txt `latency_s` late (the server's thread
        sleeps: its CPU is not ours)."""
        route = self.route

        def late(hit: Hit) -> Answer:
            if latency_s > 0 and hit.path != "/robots.txt":
                time.sleep(latency_s)
            return route(hit)

        return late

    def write_urls(self, site: LoggedSite, path: Path) -> None:
        path.write_text("".join(f"{site.url(page)}\n" for page in self.paths), encoding="utf-8")


def generated_route(count: int) -> Route:
    """robots.txt allowing everything, bench/perf_site.py's page n at /p/<n>.html, 404 for any
    other path."""

    numbers = {f"/p/{n}.html": n for n in range(count)}

    def route(hit: Hit) -> Answer:
        if hit.path == "/robots.txt":
            return pages_route(hit)
        number = numbers.get(hit.path)
        if number is None:
            return Answer(404, b"", {"Content-Type": "text/plain"})
        body = page_html(f"http://{hit.domain}", number, count)
        return Answer(200, body, {"Content-Type": "text/html; charset=utf-8"})

    return route


def corpus_route(bodies: dict[str, bytes]) -> Route:
    """robots.txt allowing everything, these pages as HTML, 404 for any other path."""

    def route(hit: Hit) -> Answer:
        if hit.path == "/robots.txt":
            return pages_route(hit)
        body = bodies.get(hit.path)
        if body is None:
            return Answer(404, b"", {"Content-Type": "text/plain"})
        return Answer(200, body, {"Content-Type": "text/html; charset=utf-8"})

    return route


def produce(env: dict[str, str], site: LoggedSite, pages: SitePages, path: Path, run_id: str) -> float:
    """Enqueue the pages with the producer; its CPU-seconds."""
    pages.write_urls(site, path)
    before = os.times()
    done = subprocess.run(
        [sys.executable, "-m", "producer", "--urls", str(path), "--run-id", run_id],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"producer failed: {done.stderr.strip()[-2000:]}")
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def scrape(ports: list[int]) -> dict[str, float]:
    """The workers' counters, summed over labels and workers."""
    totals: dict[str, float] = {}
    for port in ports:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        for line in text.splitlines():
            name = line.partition("{")[0] if "{" in line else line.partition(" ")[0]
            if line.startswith("#") or not name.endswith("_total"):
                continue
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def wait_until_done(settings: Settings, pages: int, count_dead: bool) -> tuple[float, int]:
    """Wait until every page is stored or, with `count_dead`, dead-lettered (a real page can
    be over the parse budget: the docs' 2.5-MB index is); the CPU-seconds the polling cost
    PostgreSQL, which is the bench's, not the crawl's (over a 5-minute polite crawl of 600
    pages, 0.25 ms a page), and the dead letters. Polls one connection: a connection a poll
    cost PostgreSQL a backend's start each time. Dead letters wait in their queue, as no
    dead-letter consumer runs; it is read only while pages are missing."""
    query = sql.SQL("SELECT count(*) FROM {}.pages").format(sql.Identifier(settings.pg_schema))
    deadline = time.monotonic() + DONE_TIMEOUT_S
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(db.connect(settings, autocommit=True))
        channel = (
            stack.enter_context(broker.connect(settings, "bench-politeness-cost")).channel()
            if count_dead
            else None
        )
        backend = conn.info.backend_pid  # on this machine: its CPU is in /proc
        while time.monotonic() < deadline:
            row: tuple[int] | None = conn.execute(query).fetchone()  # type: ignore[assignment]
            stored = int(row[0]) if row is not None else 0
            dead = 0
            if channel is not None and stored < pages:
                dead, _ = broker.queue_depth(channel, dead_letter_queue(settings.crawl_namespace))
            if stored + dead >= pages:
                return proc_cpu_s(backend), dead
            time.sleep(0.5)
    raise SystemExit("the crawl did not finish within 15 minutes")


def env_for(name: str, rate: float) -> dict[str, str]:
    return {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "RATE_LIMIT_RPS": str(rate),
        "FETCH_ALLOWLIST": "127.0.0.1/32",  # the site is on loopback, which fetches refuse by default
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
    }


def redis_reads(settings: Settings) -> int:
    """Read events the Redis server has processed: one per round trip of a client, whatever the
    commands it carried (a pipeline read in one go counts once), a few from the bench itself."""
    with connect_redis(settings, OPERATOR) as client:
        return int(client.info("stats")["total_reads_processed"])


def services_idle_rate() -> float:
    """CPU-seconds a second the services spend with nothing of ours running."""
    before, started = services_cpu_s(), time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    return services_delta(before, services_cpu_s()) / (time.monotonic() - started)


def crawl(
    workers_n: int, rate: float, pages: SitePages, log_dir: Path, run: int = 1, latency_s: float = 0.0
) -> Result:
    idle_rate = services_idle_rate()
    name = f"bench{secrets.token_hex(4)}"
    env = env_for(name, rate or UNBOUND_RPS)
    settings = Settings.from_env(env)
    tag = f"{workers_n}w-{rate:g}rps-{run}"
    with LoggedSite(pages.answered_late(latency_s), ["127.0.0.1"]) as site:
        workers, ports = start_workers(env, workers_n, log_dir, tag)
        try:
            wait_for_consumers(settings, workers, consumers=workers_n)
            services_before, span_started = services_cpu_s(), time.monotonic()
            reads_before = redis_reads(settings)
            workers_before = sum(tree_cpu_s(w.pid) for w in workers)  # starting up is not crawling
            producer_cpu = produce(env, site, pages, log_dir / f"{tag}-urls.txt", name)
            first = wait_for_first_hit(site, workers)
            polling_cpu, dead = wait_until_done(settings, len(pages.paths), pages.dead_letters_possible)
            ended = time.monotonic()
            workers_cpu = sum(tree_cpu_s(w.pid) for w in workers) - workers_before
            services_after = services_cpu_s()
            reads = redis_reads(settings) - reads_before
            span_s = time.monotonic() - span_started
            counters = scrape(ports)
        finally:
            stop(workers)
        hits = site.hits
    cleanup(settings)
    times = write_hits(log_dir / f"{tag}-site-hits.jsonl", hits)
    by_name = services_delta_by_name(services_before, services_after)
    by_name["postgres"] = by_name.get("postgres", 0.0) - polling_cpu
    return Result(
        label=f"{workers_n} workers, {'unbound' if not rate else f'{rate:g}/s'}",
        wall_s=ended - first,
        requests=len(times),
        worst_window=most_in_any_window(times, 1.0),
        ours_cpu_s=workers_cpu + producer_cpu,
        services_cpu_s=services_delta(services_before, services_after) - polling_cpu,
        services_idle_cpu_s=idle_rate * span_s,
        publishes=len(pages.paths) + resent(counters),
        deferrals=int(counters.get("crawl_deferrals_total", 0)),
        deliveries=int(counters.get("crawl_messages_consumed_total", 0)),
        services_by_name=by_name,
        redis_reads=reads,
        polling_cpu_s=polling_cpu,
        dead_letters=dead,
    )


def resent(counters: dict[str, float]) -> int:
    """Publishes the workers made beyond the producer's one a URL: deferrals and retries."""
    return int(sum(counters.get(f"crawl_{n}_total", 0) for n in ("deferrals", "retries")))


def write_hits(path: Path, hits: list[Hit]) -> list[float]:
    """Keep the site's log of a crawl; its requests' times, in order."""
    with path.open("w", encoding="utf-8") as out:
        for hit in hits:
            out.write(json.dumps({"at": hit.at, "path": hit.path}) + "\n")
    return sorted(hit.at for hit in hits)


def scrapy_crawl(
    rate: float, pages: SitePages, log_dir: Path, run: int = 1, latency_s: float = 0.0
) -> Result:
    """The same crawl by Scrapy: one process, the same site, pages, rate and per-domain cap."""
    idle_rate = services_idle_rate()
    tag = f"scrapy-{rate:g}rps-{run}"
    per_domain = Settings.from_env(env_for("benchscrapy", rate or UNBOUND_RPS)).max_concurrent_per_domain
    with LoggedSite(pages.answered_late(latency_s), ["127.0.0.1"]) as site:
        urls = log_dir / f"{tag}-urls.txt"
        pages.write_urls(site, urls)
        services_before, span_started = services_cpu_s(), time.monotonic()
        done = subprocess.run(
            [
                sys.executable, "-m", "bench.scrapy_run", "--urls", str(urls),
                "--out", str(log_dir / f"{tag}-items.jsonl"), "--per-domain", str(per_domain),
                "--delay", str(RATE_HEADROOM / rate if rate else 0),
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        services_after, span_s = services_cpu_s(), time.monotonic() - span_started
        hits = site.hits
    (log_dir / f"{tag}.log").write_text(done.stderr + done.stdout, encoding="utf-8")  # stdout: its report
    if done.returncode != 0:
        raise SystemExit(f"Scrapy failed: {done.stderr.strip()[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["pages"] != len(pages.paths):
        stored = f"Scrapy stored {report['pages']} of {len(pages.paths)} pages"
        raise SystemExit(f"{stored}; see {log_dir / tag}.log")
    times = write_hits(log_dir / f"{tag}-site-hits.jsonl", hits)
    return Result(
        label=f"Scrapy, {'unbound' if not rate else f'{rate:g}/s'}",
        wall_s=times[-1] - times[0],
        requests=len(times),
        worst_window=most_in_any_window(times, 1.0),
        ours_cpu_s=report["cpu_s"],
        services_cpu_s=services_delta(services_before, services_after),
        services_idle_cpu_s=idle_rate * span_s,
        publishes=0,
        deferrals=0,
        deliveries=0,
        services_by_name=services_delta_by_name(services_before, services_after),
        through_broker=False,
    )


def idle_worker_cpu(rate: float, window_s: float, log_dir: Path) -> float:
    """Percent of a core used by one worker whose every prefetched URL waits for its slot."""
    name = f"bench{secrets.token_hex(4)}"
    env = env_for(name, rate)
    settings = Settings.from_env(env)
    with LoggedSite(pages_route, ["127.0.0.1"]) as site:
        workers, _ = start_workers(env, 1, log_dir, "idle")
        try:
            wait_for_consumers(settings, workers)
            produce(env, site, SitePages.synthetic(40), log_dir / "idle-urls.txt", name)
            wait_for_first_hit(site, workers)
            time.sleep(3.0)  # the robots.txt and the first page behind it
            before, started = proc_cpu_s(workers[0].pid), time.monotonic()
            time.sleep(window_s)
            used = proc_cpu_s(workers[0].pid) - before
            elapsed = time.monotonic() - started
        finally:
            stop(workers)
    cleanup(settings)
    return 100 * used / elapsed


@dataclass
class Runs:
    """Every crawl of a bench run, in the order they ran; a pair is (polite, unbound)."""

    ours: list[Result] = field(default_factory=list)
    pairs: list[tuple[Result, Result]] = field(default_factory=list)
    scrapy: list[Result] = field(default_factory=list)
    scrapy_pairs: list[tuple[Result, Result]] = field(default_factory=list)


def run_all(args: argparse.Namespace, pages: SitePages, log_dir: Path) -> Runs:
    runs = Runs()
    latency_s = args.latency_ms / 1000
    for count in args.worker_counts:
        for run in range(1, args.repeat + 1):
            result = crawl(count, args.rate, pages, log_dir, run, latency_s)
            runs.ours.append(result)
            print(f"{HEADER}\n{result.row(args.pages)}\n{result.services_row(args.pages)}", file=sys.stderr)
            if args.with_unbound:
                unbound = crawl(count, 0.0, pages, log_dir, run, latency_s)
                print(f"{unbound.row(args.pages)}\n{unbound.services_row(args.pages)}", file=sys.stderr)
                runs.pairs.append((result, unbound))
            if args.with_scrapy:
                scrapy = scrapy_crawl(args.rate, pages, log_dir, run, latency_s)
                runs.scrapy.append(scrapy)
                print(scrapy.row(args.pages), file=sys.stderr)
                if args.with_unbound:
                    scrapy_unbound = scrapy_crawl(0.0, pages, log_dir, run, latency_s)
                    print(scrapy_unbound.row(args.pages), file=sys.stderr)
                    runs.scrapy_pairs.append((scrapy, scrapy_unbound))
    return runs


def print_tables(runs: Runs, pages: int) -> None:
    print(HEADER)
    for result in runs.ours + [unbound for _, unbound in runs.pairs]:
        print(result.row(pages))
    for result in runs.scrapy + [unbound for _, unbound in runs.scrapy_pairs]:
        print(result.row(pages))
    if runs.pairs:
        print(f"\n{'pair':<18} {'ours':>6} {'machine':>8} {'net':>6}   (polite / unbound, CPU a page)")
        for polite, unbound in runs.pairs + runs.scrapy_pairs:
            print(f"{polite.label:<18} " + ratio_columns(polite.ratios(unbound)))
    if runs.scrapy:
        print(f"\n{'polite crawl':<18} {'ours':>6} {'machine':>8} {'net':>6}   (ours / Scrapy's, CPU a page)")
        for ours, scrapy in zip(runs.ours, runs.scrapy, strict=True):
            print(f"{ours.label:<18} " + ratio_columns(ours.ratios(scrapy)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="politeness-cost-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        pages, kind = site_pages(args)
    except CorpusUnavailable as exc:
        print(f"error: --real-pages: {exc}", file=sys.stderr)
        return 2
    runs = run_all(args, pages, log_dir)
    print(f"\n{args.pages} {kind} of one host; CPU in ms a page; logs in {log_dir}")
    print(f"RabbitMQ's management plugin: {management_plugin_state()}")
    print_tables(runs, args.pages)
    if args.idle_rate > 0:
        idle = idle_worker_cpu(args.idle_rate, args.idle_window, log_dir)
        print(f"\nidle-waiting worker (1 worker, rate {args.idle_rate:g}/s): {idle:.2f} % of a core")
    bound = math.floor(args.rate) if args.rate else None
    print(
        json.dumps(
            {
                "bound_per_1s": bound,
                "results": [r.__dict__ for r in runs.ours],
                "unbound": [unbound.__dict__ for _, unbound in runs.pairs],
                "scrapy": [r.__dict__ for r in runs.scrapy],
                "scrapy_unbound": [unbound.__dict__ for _, unbound in runs.scrapy_pairs],
            }
        )
    )
    return 0 if bound is None or all(r.worst_window <= bound for r in runs.ours) else 1


def site_pages(args: argparse.Namespace) -> tuple[SitePages, str]:
    """What the one host serves, and its name in the summary."""
    if args.real_pages:
        return SitePages.real(args.pages), "real pages (bench/real_corpus.py)"
    if args.bench_pages:
        return SitePages.generated(args.pages), "generated pages of about 6 KB (bench/perf_site.py)"
    return SitePages.synthetic(args.pages), "small synthetic pages"


def management_plugin_state() -> str:
    """On or off: with it on, RabbitMQ's statistics of a crawl's queues and channels cost about
    0.8 ms a page of a 2-page/s crawl (docs/POLITENESS.md), so runs compare only like with like."""
    return "on" if management.answers(Settings.from_env()) else "off"


def ratio_columns(ratios: tuple[float, float, float]) -> str:
    return " ".join(f"{ratio:>{width}.2f}x" for ratio, width in zip(ratios, (5, 7, 5), strict=True))


if __name__ == "__main__":
    sys.exit(main())
