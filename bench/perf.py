"""python -m bench.perf: our pipeline beside Scrapy on the same local sites, in the same run.

Prints one table: latency-bound and CPU-bound pages/s (ours, Scrapy, ratio), CPU seconds per
stored page (our processes, the services, Scrapy, and the whole machine: each side's processes
plus what it made the site and the services spend), real pages (a Debian package's HTML
documentation, bench/real_corpus.py) crawled the way `make crawl` starts the workers (one pool
at the default fetches in flight) and at Scrapy's fetches in flight, producer URLs/s, dedup
bytes per URL in Redis, worker peak RSS with 32 fetches in flight, and pages/s by number of
workers. Every tuned row (more fetches in flight for us than for Scrapy) has a row at equal
fetches in flight beside it. Every run uses fresh queue, key and schema names and removes them
afterwards. Needs the local RabbitMQ, Redis and PostgreSQL, and Scrapy (`pip install -e
'.[bench]'`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.dedup_memory import dedup_bytes_per_url
from bench.measure import Children, proc_cpu_s, services_cpu_s, services_delta
from bench.raw_publish import raw_publish_rate
from bench.real_corpus import CorpusUnavailable, ensure_corpus
from ops.accounting import Tally, account
from ops.crawl_workers import worker_launches
from ops.teardown import remove_pipeline
from shared.settings import Settings

SITE_PORT = 8531
# Fetches in flight per worker on the slow site: 4 x 24. With every answer 100 ms away, no
# crawler makes more than (fetches in flight) / 0.1 s pages a second: 640 for Scrapy's 64, and
# Scrapy itself reaches 380-430 when the machine runs fast, so 1.5 times that is out of reach
# of anything holding 64 in flight. Our workers hold 96; each domain still gets at most 8 at a
# time, as in Scrapy (MAX_CONCURRENT_PER_DOMAIN). On the fast site more threads only contend
# for the interpreter lock of a CPU-bound worker: every thread switch costs a futex handoff,
# so 8 keep the cores busy with less waste.
LATENCY_CONCURRENCY = 24
CPU_CONCURRENCY = 8
RSS_CONCURRENCY = 32  # the memory goal is stated for 32 fetches in flight
# Scrapy's settings in the tuned rows (CONCURRENT_REQUESTS, CONCURRENT_REQUESTS_PER_DOMAIN).
SCRAPY_CONCURRENCY = 64
PER_DOMAIN = 8
# Real pages: the goal is stated at equal fetches in flight, a pool of 4 workers x 8 = 32 for us,
# CONCURRENT_REQUESTS = 32 for Scrapy. Beside it, ours as `make crawl WORKERS=4` runs: the same
# pool at FETCH_CONCURRENCY's default.
REAL_WORKERS = 4
REAL_CONCURRENCY = 8
REAL_HOSTS = 20
REAL_PAGES = 5_300  # per side and round; --real-pages for a quick run
# The machine's speed drifts by a fifth over minutes (other tenants of the host): each
# comparison runs Scrapy and ours in turn this many times, and the figures are the totals.
ROUNDS = 2


class Beside(Protocol):
    """Something running beside a crawl (bench.dashboard_cost's open run pages), told when the
    timed part begins and ends."""

    def begin(self) -> None: ...
    def end(self) -> None: ...


# Started with the crawl's environment and run id, before the crawl and until its services stop.
BesideCrawl = Callable[[dict[str, str], str], contextlib.AbstractContextManager[Beside]]


@dataclass(frozen=True)
class Result:
    pages: int
    elapsed_s: float
    own_cpu_s: float
    services_cpu_s: float
    worker_peak_rss_mb: float = 0.0
    site_cpu_s: float = 0.0  # the site server's CPU while this run crawled it
    worker_cpu_s: float = 0.0  # the part of own_cpu_s that the worker processes spent

    def machine_cpu_s(self, uses_services: bool = True) -> float:
        """Whole-machine CPU of this side: its processes, the site and, for ours, the services.
        Scrapy uses none of the services: what they did meanwhile was others' work."""
        return self.own_cpu_s + self.site_cpu_s + (self.services_cpu_s if uses_services else 0.0)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed_s if self.elapsed_s else 0.0

    def __add__(self, other: Result) -> Result:
        return Result(
            pages=self.pages + other.pages,
            elapsed_s=self.elapsed_s + other.elapsed_s,
            own_cpu_s=self.own_cpu_s + other.own_cpu_s,
            services_cpu_s=self.services_cpu_s + other.services_cpu_s,
            worker_peak_rss_mb=max(self.worker_peak_rss_mb, other.worker_peak_rss_mb),
            site_cpu_s=self.site_cpu_s + other.site_cpu_s,
            worker_cpu_s=self.worker_cpu_s + other.worker_cpu_s,
        )


def in_turn(
    rounds: int, scrapy: Callable[[], Result], ours: Callable[[], Result]
) -> tuple[Result, Result, str]:
    """Both systems `rounds` times, alternating: their totals, and each round's pages/s as
    "ours/Scrapy"."""
    totals, each = alternate(rounds, {"scrapy": scrapy, "ours": ours})
    return totals["scrapy"], totals["ours"], each


def alternate(rounds: int, sides: dict[str, Callable[[], Result]]) -> tuple[dict[str, Result], str]:
    """Every side once per round, in turn, `rounds` times: each side's totals, and each round's
    pages/s as "a/b/..." in the order of `sides`."""
    runs: dict[str, list[Result]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            runs[name].append(run())
    each = ", ".join("/".join(f"{runs[name][i].pages_per_s:.0f}" for name in sides) for i in range(rounds))
    return {name: sum(results[1:], results[0]) for name, results in runs.items()}, each


@dataclass(frozen=True)
class SiteProcess:
    """The running site server: its CPU is part of each side's whole-machine figure."""

    pid: int

    def cpu_s(self) -> float:
        return proc_cpu_s(self.pid)


@contextlib.contextmanager
def perf_site(
    hosts: int,
    pages_per_host: int,
    delay_ms: int,
    log_dir: Path,
    root: Path | None = None,
    port: int = SITE_PORT,
    links_per_page: int = 20,
    prebuild: bool = False,
) -> Iterator[SiteProcess]:
    log = (log_dir / "site.log").open("wb")
    site = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.perf_site",
            "--hosts",
            str(hosts),
            "--pages-per-host",
            str(pages_per_host),
            "--delay-ms",
            str(delay_ms),
            "--port",
            str(port),
            *(["--root", str(root)] if root else []),
            "--links-per-page",
            str(links_per_page),
            *(["--prebuild"] if prebuild else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_site(site, log_dir / "site.log")
        yield SiteProcess(site.pid)
    finally:
        site.terminate()
        site.wait(timeout=10)
        log.close()


def _wait_for_site(site: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    """Until the site says it serves (its pages and sitemaps built, a while for 100,000 pages).
    An open port is not enough: another benchmark's site on the same port would pass for it,
    and the crawl would measure that site while this one failed to bind."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if site.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines()
            raise RuntimeError(f"benchmark site exited with {site.returncode}: {lines[-1] if lines else ''}")
        if b"perf site: " in log.read_bytes():
            return
        time.sleep(0.1)
    raise RuntimeError(f"benchmark site did not start in {timeout_s:.0f} s; see {log}")


def _wait_for_port(address: str, timeout_s: float = 15) -> None:
    import socket

    host, port = address.split(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"benchmark site did not start on {address}")


def pipeline_env(name: str, concurrency: int | None = LATENCY_CONCURRENCY, **extra: str) -> dict[str, str]:
    """The services' environment; `concurrency` None leaves FETCH_CONCURRENCY as `make crawl`
    does: this environment's, or the default."""
    return {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/crawler_bench",
        "RATE_LIMIT_RPS": "10000",  # high enough not to bind: this measures throughput
        "FETCH_ALLOWLIST": "127.0.0.0/8",
        **({} if concurrency is None else {"FETCH_CONCURRENCY": str(concurrency)}),
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def run_pipeline(
    producer_args: list[str],
    workers: int,
    concurrency: int | None,
    log_dir: Path,
    timeout_s: float = 900,
    *,
    site: SiteProcess | None = None,
    extra_env: dict[str, str] | None = None,
    beside: BesideCrawl | None = None,
) -> Result:
    """Start the dead-letter consumer and workers, run the producer, wait until every URL is
    accounted. The workers are laid out as `make crawl WORKERS=N` lays them out
    (ops/crawl_workers.py: one `python -m worker --processes N`), with `concurrency` fetches in
    flight each, or with None what `make crawl` gives them. `beside` runs alongside, started
    before the timed part."""
    name = f"bench{secrets.token_hex(4)}"
    env = pipeline_env(name, concurrency, **(extra_env or {}))
    settings = Settings.from_env(env)
    run_log = log_dir / name
    run_log.mkdir(parents=True)
    children = Children(env, run_log)
    with contextlib.ExitStack() as alongside:
        watcher = alongside.enter_context(beside(env, name)) if beside else None
        return _timed_run(producer_args, workers, name, settings, children, timeout_s, site, watcher)


def _timed_run(
    producer_args: list[str],
    workers: int,
    name: str,
    settings: Settings,
    children: Children,
    timeout_s: float,
    site: SiteProcess | None,
    watcher: Beside | None,
) -> Result:
    run_log = children.log_dir
    before = services_cpu_s()
    site_before = site.cpu_s() if site else 0.0
    if watcher:
        watcher.begin()
    started = time.monotonic()
    try:
        children.start("dlq_consumer", "-m", "dlq_consumer")
        for launch in worker_launches(workers):
            children.start(launch.name, "-m", "worker", *launch.args)
        producer = children.start(
            "producer", "-m", "producer", "--run-id", name, *producer_args, stdout=subprocess.PIPE
        )
        assert producer.process.stdout is not None
        summary_text = producer.process.stdout.read().decode()  # EOF when it exits; wait4 reaps it
        children.reap(producer)
        if producer.exit_code != 0 or not summary_text.strip():
            raise RuntimeError(f"producer failed with {producer.exit_code}; see {run_log}")
        expected = int(json.loads(summary_text.strip().splitlines()[-1])["enqueued_total"])
        deadline = time.monotonic() + timeout_s
        with Tally(settings, name) as tally:
            while (accounted := tally.accounted()) < expected:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out: {accounted} of {expected} accounted; see {run_log}")
                time.sleep(0.1)
        elapsed = time.monotonic() - started
        if watcher:
            watcher.end()
        final = account(settings, name)
    finally:
        children.stop_all()
        after = services_cpu_s()
        site_after = site.cpu_s() if site else 0.0
        _cleanup(settings)
    return Result(
        pages=final.stored,
        elapsed_s=elapsed,
        own_cpu_s=children.cpu_s(),
        services_cpu_s=services_delta(before, after),
        worker_peak_rss_mb=max(
            (c.peak_rss_mb for c in children.finished if c.name.startswith("worker")), default=0.0
        ),
        site_cpu_s=site_after - site_before,
        worker_cpu_s=children.cpu_s("worker"),
    )


def run_producer_only(producer_args: list[str], log_dir: Path) -> tuple[int, float]:
    """(URLs enqueued, seconds) for the producer alone, dedup and confirms included."""
    name = f"bench{secrets.token_hex(4)}"
    env = pipeline_env(name)
    settings = Settings.from_env(env)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "producer", "--run-id", name, *producer_args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        _cleanup(settings)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return int(summary["enqueued_total"]), float(summary["elapsed_s"])


def run_scrapy(
    args: list[str],
    log_dir: Path,
    *,
    site: SiteProcess | None = None,
    concurrency: int = SCRAPY_CONCURRENCY,
    per_domain: int = PER_DOMAIN,
    out: Path | None = None,  # where its items go (default: a new file in log_dir)
) -> Result:
    before = services_cpu_s()
    site_before = site.cpu_s() if site else 0.0
    out = out or log_dir / f"scrapy-{secrets.token_hex(3)}.jsonl"
    # Timed from the launch, as our pipeline is: both pay their start-up within the figure.
    launched = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scrapy_run",
            *args,
            "--out",
            str(out),
            "--concurrency",
            str(concurrency),
            "--per-domain",
            str(per_domain),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    after = services_cpu_s()
    site_after = site.cpu_s() if site else 0.0
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Result(
        pages=int(figures["pages"]),
        elapsed_s=float(figures["finished_at"]) - launched,
        own_cpu_s=float(figures["cpu_s"]),
        services_cpu_s=services_delta(before, after),
        worker_peak_rss_mb=float(figures["peak_rss_mb"]),
        site_cpu_s=site_after - site_before,
    )


def _cleanup(settings: Settings) -> None:
    remove_pipeline(settings)


@dataclass
class Table:
    rows: list[tuple[str, str, str, str, str]]

    def add(self, figure: str, ours: str, reference: str = "", ratio: str = "", goal: str = "") -> None:
        self.rows.append((figure, ours, reference, ratio, goal))

    def render(self) -> str:
        header = ("figure", "ours", "Scrapy", "ratio", "goal")
        widths = [max(len(r[i]) for r in [header, *self.rows]) for i in range(5)]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
            for row in [header, *self.rows]
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def compare(
    table: Table,
    label: str,
    ours: Result,
    scrapy: Result,
    goal_ratio: float | None,
    own_cpu_goal: float = 1.0,
) -> None:
    """Throughput, CPU per page (ours, the services, the whole machine) and memory, ours beside
    Scrapy's. `goal_ratio` None: a row for information, without a goal (a tuned row's twin)."""
    ratio = ours.pages_per_s / scrapy.pages_per_s
    ours_cpu_ms = 1000 * ours.own_cpu_s / ours.pages
    scrapy_cpu_ms = 1000 * scrapy.own_cpu_s / scrapy.pages
    table.add(
        label,
        f"{ours.pages_per_s:.0f}",
        f"{scrapy.pages_per_s:.0f}",
        f"{ratio:.2f}x",
        f">= {goal_ratio}x: {verdict(ratio >= goal_ratio)}" if goal_ratio else "",
    )
    own_goal = "ours <= Scrapy" if own_cpu_goal == 1.0 else f"ours <= {own_cpu_goal}x Scrapy"
    table.add(
        "  CPU per page, own processes",
        f"{ours_cpu_ms:.2f} ms",
        f"{scrapy_cpu_ms:.2f} ms",
        f"{ours_cpu_ms / scrapy_cpu_ms:.2f}x",
        f"{own_goal}: {verdict(ours_cpu_ms <= own_cpu_goal * scrapy_cpu_ms)}",
    )
    ours_machine_ms = 1000 * ours.machine_cpu_s() / ours.pages
    scrapy_machine_ms = 1000 * scrapy.machine_cpu_s(uses_services=False) / scrapy.pages
    table.add(
        "  CPU per page, whole machine (ours: + services + site; Scrapy: + site)",
        f"{ours_machine_ms:.2f} ms",
        f"{scrapy_machine_ms:.2f} ms",
        f"{ours_machine_ms / scrapy_machine_ms:.2f}x",
        f"ours <= Scrapy: {verdict(ours_machine_ms <= scrapy_machine_ms)}",
    )
    # Scrapy uses none of the three; whatever they did meanwhile is other work on the machine.
    table.add(
        "  CPU per page, RabbitMQ+Redis+PostgreSQL",
        f"{1000 * ours.services_cpu_s / ours.pages:.2f} ms",
        "n/a",
    )
    table.add(
        "  peak RSS of one worker / of Scrapy",
        f"{ours.worker_peak_rss_mb:.0f} MB",
        f"{scrapy.worker_peak_rss_mb:.0f} MB",
    )


def real_pages(table: Table, pages: int, rounds: int, log_dir: Path) -> None:
    """Real pages (bench/real_corpus.py) on 20 hosts at 100 ms, CPU-bound: ours as `make crawl
    WORKERS=4` runs it, ours at 32 fetches in flight, and Scrapy at 32."""
    try:
        root = ensure_corpus()
    except CorpusUnavailable as exc:
        table.add(f"real pages: skipped, {exc}", "")
        return
    per_host = max(1, pages // REAL_HOSTS)
    in_flight = REAL_WORKERS * REAL_CONCURRENCY
    crawl_concurrency = Settings.from_env(pipeline_env("benchreal", None)).fetch_concurrency
    with perf_site(REAL_HOSTS, per_host, 100, log_dir, root=root) as site:
        index = [f"--sitemap=http://127.0.1.1:{SITE_PORT}/sitemap_index.xml"]
        totals, each = alternate(
            rounds,
            {
                "crawl": lambda: run_pipeline(index, REAL_WORKERS, None, log_dir, site=site),
                "pool": lambda: run_pipeline(index, REAL_WORKERS, REAL_CONCURRENCY, log_dir, site=site),
                "scrapy": lambda: run_scrapy(
                    ["--sitemap", index[0].split("=", 1)[1]], log_dir, site=site, concurrency=in_flight
                ),
            },
        )
    # The goal is stated at equal fetches in flight; `make crawl`'s row, with more, is beside it.
    for key, how, goal in (
        ("crawl", f"x {crawl_concurrency}, as `make crawl WORKERS=4` runs them", None),
        ("pool", f"x {REAL_CONCURRENCY}, at equal fetches in flight", 1.5),
    ):
        compare(
            table,
            f"real pages/s ({totals[key].pages // rounds} pages of {root.parent.name} docs, {REAL_HOSTS} "
            f"hosts, 100 ms; a pool of {REAL_WORKERS} workers {how}, Scrapy {in_flight}; "
            f"{rounds} rounds, crawl/pool/Scrapy: {each})",
            totals[key],
            totals["scrapy"],
            goal,
            own_cpu_goal=0.8,
        )


def producer_floor_dedup(table: Table, sections: set[str], scale: int, log_dir: Path) -> None:
    """The producer's rate, the one-thread floors and dedup memory: one side each."""
    if "producer" in sections:
        pages_per_host = 5000 // scale
        with perf_site(20, pages_per_host, 0, log_dir):
            enqueued, seconds = run_producer_only(
                [f"--sitemap=http://127.0.1.1:{SITE_PORT}/sitemap_index.xml"], log_dir
            )
            rate = enqueued / seconds
            table.add(
                f"producer URLs/s ({enqueued} URLs, gzipped sitemaps, dedup + confirms)",
                f"{rate:.0f}",
                "",
                "",
                f">= 20000: {verdict(rate >= 20000)}",
            )
        raw_rate = raw_publish_rate(Settings.from_env(pipeline_env(f"bench{secrets.token_hex(4)}")))
        table.add(
            "  this machine today: pika alone, persistent messages/s, no confirms (ratio: producer / it)",
            f"{raw_rate:.0f}",
            "",
            f"{rate / raw_rate:.2f}x",
        )

    if "floor" in sections:
        # Imported here: Scrapy and Twisted would swell this process for every other section.
        from bench.floor import measure as measure_floor

        with perf_site(1, 10, 0, log_dir):
            floor = measure_floor(
                f"http://127.0.1.1:{SITE_PORT}/p/1.html", Settings.from_env(pipeline_env("benchfloor"))
            )
        table.add(
            "parse one page, CPU in one thread (BeautifulSoup / Scrapy's parsel)",
            f"{floor.parse_ms:.2f} ms",
            f"{floor.scrapy_parse_ms:.2f} ms",
            f"{floor.parse_ms / floor.scrapy_parse_ms:.1f}x",
        )
        table.add(
            "fetch one page, CPU in one thread (requests / urllib3 alone)",
            f"{floor.fetch_ms:.2f} ms",
            f"{floor.urllib3_fetch_ms:.2f} ms",
            f"{floor.fetch_ms / floor.urllib3_fetch_ms:.1f}x",
        )

    if "dedup" in sections:
        for count in (1_000_000 // scale, 10_000_000 // scale):
            per_url = dedup_bytes_per_url(count)
            table.add(
                f"dedup memory, {count:,} URLs",
                f"{per_url:.1f} B/URL",
                "136 B/URL (SADD of URLs)",
                "",
                f"<= 24: {verdict(per_url <= 24)}",
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not the figures")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns of each side in a comparison")
    parser.add_argument(
        "--only",
        default="latency,cpu,real,floor,producer,dedup,scaling,discovery,discovery-cost",
        help="comma list of sections to run (real: real pages alone)",
    )
    parser.add_argument(
        "--real-pages",
        type=int,
        default=REAL_PAGES,
        help=f"real pages per side and round, spread over {REAL_HOSTS} hosts (a quick run: 400)",
    )
    parser.add_argument(
        "--discovery-pages",
        type=int,
        default=0,
        help="pages of the discovery cost site (default 100,000; --quick 10,000)",
    )
    args = parser.parse_args(argv)
    sections = set(args.only.split(","))
    scale = 10 if args.quick else 1
    rounds = args.rounds
    log_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    table = Table([])
    print(f"logs in {log_dir}", flush=True)

    if "latency" in sections or "scaling" in sections:
        pages_per_host = 250 // scale
        urls = log_dir / "latency-urls.txt"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.perf_site",
                "--hosts",
                "20",
                "--pages-per-host",
                str(pages_per_host),
                "--port",
                str(SITE_PORT),
                "--write-urls",
                str(urls),
            ],
            check=True,
        )
        with perf_site(20, pages_per_host, 100, log_dir) as site:
            if "latency" in sections:
                equal = SCRAPY_CONCURRENCY // 4
                totals, each = alternate(
                    rounds,
                    {
                        "scrapy": lambda: run_scrapy(["--urls", str(urls)], log_dir, site=site),
                        "tuned": lambda: run_pipeline(
                            ["--urls", str(urls)], 4, LATENCY_CONCURRENCY, log_dir, site=site
                        ),
                        "equal": lambda: run_pipeline(["--urls", str(urls)], 4, equal, log_dir, site=site),
                    },
                )
                compare(
                    table,
                    f"latency-bound pages/s ({totals['tuned'].pages // rounds} pages, 20 hosts, 100 ms, "
                    f"a pool of 4 workers x {LATENCY_CONCURRENCY} in flight, Scrapy {SCRAPY_CONCURRENCY}; "
                    f"{rounds} rounds, Scrapy/ours/ours at equal: {each})",
                    totals["tuned"],
                    totals["scrapy"],
                    1.5,
                )
                compare(
                    table,
                    f"  the same at equal fetches in flight: 4 x {equal} = {SCRAPY_CONCURRENCY}",
                    totals["equal"],
                    totals["scrapy"],
                    None,
                )
                alone = run_pipeline(["--urls", str(urls)], 1, RSS_CONCURRENCY, log_dir)
                table.add(
                    f"worker peak RSS, {RSS_CONCURRENCY} fetches in flight ({alone.pages} pages)",
                    f"{alone.worker_peak_rss_mb:.0f} MB",
                    "",
                    "",
                    f"<= 80 MB: {verdict(alone.worker_peak_rss_mb <= 80)}",
                )
            if "scaling" in sections:
                for workers in (1, 2, 4, 8):
                    result = run_pipeline(["--urls", str(urls)], workers, LATENCY_CONCURRENCY, log_dir)
                    table.add(
                        f"scaling: {workers} worker(s) x {LATENCY_CONCURRENCY}, latency-bound pages/s",
                        f"{result.pages_per_s:.0f}",
                    )

    if "cpu" in sections:
        pages_per_host = 1000 // scale
        with perf_site(20, pages_per_host, 0, log_dir) as site:
            index = f"http://127.0.1.1:{SITE_PORT}/sitemap_index.xml"
            equal = CPU_CONCURRENCY * 4
            totals, each = alternate(
                rounds,
                {
                    "ours": lambda: run_pipeline(
                        ["--sitemap", index], 4, CPU_CONCURRENCY, log_dir, site=site
                    ),
                    "scrapy": lambda: run_scrapy(["--sitemap", index], log_dir, site=site),
                    "scrapy-equal": lambda: run_scrapy(
                        ["--sitemap", index], log_dir, site=site, concurrency=equal
                    ),
                },
            )
            compare(
                table,
                f"CPU-bound pages/s ({totals['ours'].pages // rounds} pages from a sitemap index, "
                f"a pool of 4 workers x {CPU_CONCURRENCY} in flight, Scrapy {SCRAPY_CONCURRENCY}; "
                f"{rounds} rounds, ours/Scrapy/Scrapy at equal: {each})",
                totals["ours"],
                totals["scrapy"],
                1.2,
            )
            compare(
                table,
                f"  the same at equal fetches in flight: Scrapy at {equal}",
                totals["ours"],
                totals["scrapy-equal"],
                None,
            )

    if "real" in sections:
        real_pages(table, args.real_pages, rounds, log_dir)

    producer_floor_dedup(table, sections, scale, log_dir)

    if sections & {"discovery", "discovery-cost"}:
        from bench import discovery  # imports this module's helpers: imported once they exist

        if "discovery" in sections:
            discovery.side_by_side(table, log_dir, rounds)
        if "discovery-cost" in sections:
            discovery.cost(table, log_dir, args.discovery_pages or discovery.COST_PAGES // scale)

    print()
    print(table.render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
