"""What the dashboard costs with run pages open: its CPU (percent of one core) and its
sampler's sample count, with 5 live run pages (5 SSE clients) for a while, and the latency of
the run page (HTML and JSON) and the runs list over HTTP: each one's first answer, then p50 and
p95 of 20 more, the three in turn.

`python -m bench.dashboard_cost [--pages 20000] [--dead 2000] [--clients 5] [--seconds 30]`
builds a run in a PostgreSQL schema (and namespace, Redis prefix) of its own with
bench.run_page_cost's builder (plain SQL through the writers' triggers), serves
`python -m ops.dashboard` as a process of its own on a free port, holds CLIENTS streams of
/events/runs/<run> open for SECONDS, and prints one JSON line: the dashboard's CPU over that
time, the samples its sampler took (one per interval for all the clients together, not one each),
and the latencies. Everything it made is removed at the end.

`python -m bench.dashboard_cost --crawl [--rounds 2] [--clients 5]` (`make bench-dashboard`)
measures what open pages cost a crawl: the crawl of `make bench`'s first row (bench.perf's
latency-bound site, 20 hosts x 250 pages at 100 ms, 4 workers x 24 fetches in flight), ROUNDS
times with no dashboard and ROUNDS times with a dashboard serving CLIENTS open run pages of that
crawl, in turn. An open page is what a browser tab does (static/app.js): one GET of the page,
then its live stream (/events/runs/<run>) until it closes. It prints one JSON line: pages/s of
each side (totals and each round), their ratio, the dashboard's CPU as a percent of one core
over the crawls' wall time, and the CPU a page of RabbitMQ, Redis and PostgreSQL on each side
(what the dashboard's queries add to the database shows there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.measure import proc_cpu_s
from bench.perf import LATENCY_CONCURRENCY, SITE_PORT, Result, alternate, perf_site, run_pipeline
from bench.run_page_cost import RUN, build
from ops.teardown import remove_pipeline
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def hold_stream(url: str, stop: threading.Event, received: list[int]) -> None:
    try:
        with httpx.stream("GET", url, timeout=60) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    received.append(1)
                if stop.is_set():
                    return
    except httpx.TransportError:
        if not stop.is_set():
            raise  # the dashboard closed a stream it should have kept open


@contextlib.contextmanager
def dashboard_of(env: dict[str, str], refresh_s: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`python -m ops.dashboard` as a process of its own on a free port, with the environment of
    the pipeline it shows; its process and base URL once it answers."""
    port = free_port()
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "ops.dashboard"],
        env={
            **env,
            "DASHBOARD_PORT": str(port),
            "DASHBOARD_REFRESH_S": str(refresh_s),
            "DASHBOARD_TOKEN": "",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and dashboard.poll() is None, "the dashboard did not start"
            time.sleep(0.2)
        yield dashboard, base
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=10)


class OpenPages:
    """CLIENTS run pages of a crawl open in a dashboard of its own, as browser tabs hold them:
    each loads the page once, then keeps its live stream open. Its CPU is read when the crawl's
    timed part begins and ends."""

    def __init__(self, clients: int, refresh_s: float) -> None:
        self.clients = clients
        self.refresh_s = refresh_s
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.messages = 0
        self._pid = 0
        self._cpu_at = self._wall_at = 0.0

    @contextlib.contextmanager
    def beside(self, env: dict[str, str], run_id: str) -> Iterator[OpenPages]:
        with dashboard_of(env, self.refresh_s) as (dashboard, base):
            self._pid = dashboard.pid
            stop = threading.Event()
            received: list[int] = []
            streams = [
                threading.Thread(
                    target=hold_stream, args=(f"{base}/events/runs/{run_id}", stop, received), daemon=True
                )
                for _ in range(self.clients)
            ]
            for stream in streams:
                page = httpx.get(f"{base}/runs/{run_id}", headers={"Accept": "text/html"}, timeout=30)
                assert page.status_code == 200, f"the run page answered {page.status_code}"
                stream.start()
            time.sleep(1.0)  # connected, first sample sent
            try:
                yield self
            finally:
                stop.set()
                self.messages += len(received)

    def begin(self) -> None:
        self._cpu_at, self._wall_at = proc_cpu_s(self._pid), time.monotonic()

    def end(self) -> None:
        self.cpu_s += proc_cpu_s(self._pid) - self._cpu_at
        self.wall_s += time.monotonic() - self._wall_at


def crawl_beside_pages(clients: int, rounds: int, refresh_s: float) -> dict[str, Any]:
    """`make bench`'s first row (bench.perf: the latency-bound site, our tuned side), ROUNDS
    times with no dashboard and ROUNDS times with CLIENTS run pages open, in turn."""
    log_dir = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    hosts, per_host = 20, 250
    urls = log_dir / "latency-urls.txt"
    site_args = ["--hosts", str(hosts), "--pages-per-host", str(per_host), "--port", str(SITE_PORT)]
    subprocess.run(
        [sys.executable, "-m", "bench.perf_site", *site_args, "--write-urls", str(urls)], check=True
    )
    pages = OpenPages(clients, refresh_s)
    with perf_site(hosts, per_host, 100, log_dir) as site:

        def crawl(beside: OpenPages | None) -> Result:
            return run_pipeline(
                ["--urls", str(urls)],
                4,
                LATENCY_CONCURRENCY,
                log_dir,
                site=site,
                beside=beside.beside if beside else None,
            )

        totals, each = alternate(rounds, {"none": lambda: crawl(None), "open": lambda: crawl(pages)})
    none, open_ = totals["none"], totals["open"]
    return {
        "crawl": f"{hosts} hosts x {per_host} pages at 100 ms, 4 workers x {LATENCY_CONCURRENCY}",
        "rounds": rounds,
        "clients": clients,
        "refresh_s": refresh_s,
        "pages_per_s_no_pages_open": round(none.pages_per_s, 1),
        "pages_per_s_pages_open": round(open_.pages_per_s, 1),
        "ratio_open_to_none": round(open_.pages_per_s / none.pages_per_s, 3),
        "each_round_none_open": each,
        "dashboard_cpu_percent_of_a_core": round(100 * pages.cpu_s / pages.wall_s, 2),
        "dashboard_cpu_s": round(pages.cpu_s, 2),
        "services_cpu_ms_per_page_none": round(1000 * none.services_cpu_s / none.pages, 3),
        "services_cpu_ms_per_page_open": round(1000 * open_.services_cpu_s / open_.pages, 3),
        "stream_messages": pages.messages,
        "logs": str(log_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard_cost", description=__doc__)
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--dead", type=int, default=2_000)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--refresh", type=float, default=2.0, help="DASHBOARD_REFRESH_S")
    parser.add_argument("--crawl", action="store_true", help="a crawl with and without open run pages")
    parser.add_argument("--rounds", type=int, default=2, help="--crawl: crawls of each side")
    args = parser.parse_args(argv)
    if args.crawl:
        print(json.dumps(crawl_beside_pages(args.clients, args.rounds, args.refresh)), flush=True)
        return 0
    name = f"benchdash{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env({"CRAWL_NAMESPACE": name, "PG_SCHEMA": name, "REDIS_PREFIX": name})
    db.ensure_schema(settings)
    env = {**os.environ, "CRAWL_NAMESPACE": name, "PG_SCHEMA": name, "REDIS_PREFIX": name}
    try:
        with db.connect(settings, autocommit=True) as conn:
            build(conn, args.pages, args.dead, 0)
        client = connect_redis(settings, OPERATOR)
        client.hset(Keys(name).run_stats(RUN), mapping={"enqueued.bulk": args.pages + args.dead})
        client.close()
        with dashboard_of(env, args.refresh) as (dashboard, base):
            print(json.dumps(served_figures(dashboard, base, args)), flush=True)
        return 0
    finally:
        remove_pipeline(settings)


READS = 20  # of each kind


def latencies(reads: Mapping[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Each read's first answer (templates compiled, connections opened: once in a process's
    life), then its p50 and p95 over `repeat` more, the kinds in turn, so that whatever else
    the machine does meanwhile (autovacuum of the tables just built, other tenants) falls on
    all of them alike."""
    figures: dict[str, float] = {}
    taken: dict[str, list[float]] = {name: [] for name in reads}
    for round_ in range(repeat + 1):
        for name, read in reads.items():
            started = time.perf_counter()
            read()
            ms = (time.perf_counter() - started) * 1000
            if round_ == 0:
                figures[f"{name}_first_ms"] = round(ms, 1)
            else:
                taken[name].append(ms)
    for name, times in taken.items():
        figures[f"{name}_p50_ms"] = round(statistics.median(times), 1)
        figures[f"{name}_p95_ms"] = round(statistics.quantiles(times, n=20)[-1], 1)
    return figures


def served_figures(dashboard: subprocess.Popen[bytes], base: str, args: argparse.Namespace) -> dict[str, Any]:
    """The latencies of the pages on the big run, then the CPU with CLIENTS streams open."""
    html = {"Accept": "text/html"}
    reads = {
        "run_page": lambda: httpx.get(f"{base}/runs/{RUN}", headers=html, timeout=30),
        "runs_list": lambda: httpx.get(f"{base}/", headers=html, timeout=30),
        "run_api": lambda: httpx.get(f"{base}/api/v1/runs/{RUN}", timeout=30),
    }
    figures: dict[str, Any] = {
        "pages": args.pages,
        "dead_letters": args.dead,
        "clients": args.clients,
        "seconds": args.seconds,
        "refresh_s": args.refresh,
        **latencies(reads, READS),
    }
    idle_before = proc_cpu_s(dashboard.pid)
    time.sleep(min(5.0, args.seconds / 3))
    figures["idle_cpu_percent"] = round(
        100 * (proc_cpu_s(dashboard.pid) - idle_before) / min(5.0, args.seconds / 3), 1
    )
    stop = threading.Event()
    received: list[int] = []
    streams = [
        threading.Thread(target=hold_stream, args=(f"{base}/events/runs/{RUN}", stop, received), daemon=True)
        for _ in range(args.clients)
    ]
    for stream in streams:
        stream.start()
    time.sleep(1.0)  # connected, first sample sent
    cpu_before, started = proc_cpu_s(dashboard.pid), time.monotonic()
    time.sleep(args.seconds)
    elapsed = time.monotonic() - started
    cpu = proc_cpu_s(dashboard.pid) - cpu_before
    samplers = httpx.get(f"{base}/api/v1/config", timeout=10).json()["samplers"]
    stop.set()
    run_scope = next(v for k, v in samplers.items() if k.startswith(f"run:{RUN}"))
    figures.update(
        {
            "cpu_percent_of_a_core": round(100 * cpu / elapsed, 1),
            "samples": run_scope["samples"],
            "subscribers": run_scope["subscribers"],
            "interval_s_now": run_scope["interval_s"],
            "messages_received": len(received),
            "samples_per_interval_per_client": round(
                run_scope["samples"] / max(1, len(received) / args.clients), 2
            ),
        }
    )
    return figures


if __name__ == "__main__":
    sys.exit(main())
