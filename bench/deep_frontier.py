"""python -m bench.deep_frontier: a deep frontier of N URLs (default 10,000,000) queued at once.

Writes gzipped sitemaps (50,000 URLs each, one index) listing N pages of the fast local site,
serves them on loopback, runs the producer over them and prints: the producer's URLs/s and CPU
per URL over all N; RabbitMQ's memory and the size of its data directory at that depth; Redis
memory per URL. Then it times the same worker pool crawling the same number of pages from the
deep queue and from an almost empty one (a fresh namespace of 20,000 URLs), in turn.

It needs the RabbitMQ node and Redis of deploy/local/deep.sh (`make deep-up`), never the shared
ones: millions of messages would trip a shared broker's memory or disk alarm. PostgreSQL only
stores the pages crawled, in a schema of their own that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import gzip
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.measure import Children
from bench.perf import _wait_for_port, pipeline_env
from ops.accounting import Tally
from ops.teardown import remove_pipeline
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.settings import Settings

URLS_PER_SITEMAP = 50_000
SITE_PORT = 8591
SITEMAP_PORT = 8592
HOSTS = 20
SHALLOW_URLS = 20_000


@dataclass(frozen=True)
class Services:
    amqp_url: str
    redis_url: str
    management_url: str
    node: str
    data_dir: Path

    def env(self) -> dict[str, str]:
        return {
            "AMQP_URL": self.amqp_url,
            "REDIS_URL": self.redis_url,
            "RABBITMQ_MANAGEMENT_URL": self.management_url,
        }


def page_url(i: int, hosts: int) -> str:
    """The i-th URL: hosts take turns, so each host's pages are numbered 0, 1, 2, ..."""
    return f"http://127.0.1.{i % hosts + 1}:{SITE_PORT}/p/{i // hosts}.html"


def write_sitemaps(directory: Path, urls: int, hosts: int, shallow: int) -> None:
    """index.xml over the gzipped children listing every URL, and small.xml.gz with the first
    `shallow` URLs. Kept between runs: writing ten million URLs takes a while."""
    done = directory / "complete"
    if done.exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    children = []
    for number, start in enumerate(range(0, urls, URLS_PER_SITEMAP)):
        name = f"part-{number:05d}.xml.gz"
        _write_urlset(directory / name, range(start, min(start + URLS_PER_SITEMAP, urls)), hosts)
        children.append(f"<sitemap><loc>http://127.0.0.1:{SITEMAP_PORT}/{name}</loc></sitemap>")
    (directory / "index.xml").write_text(
        '<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        + "".join(children)
        + "</sitemapindex>"
    )
    _write_urlset(directory / "small.xml.gz", range(min(shallow, urls)), hosts)
    done.write_text(f"{urls} URLs on {hosts} hosts\n")


def _write_urlset(path: Path, numbers: range, hosts: int) -> None:
    entries = "".join(f"<url><loc>{page_url(i, hosts)}</loc></url>" for i in numbers)
    xml = (
        f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
    )
    path.write_bytes(gzip.compress(xml.encode(), compresslevel=1))


def write_tail(directory: Path, urls: int, hosts: int, shallow: int, round_number: int) -> str:
    """A sitemap of `shallow` URLs from the far end of the range, different in every round, so
    the shallow side asks the page site for pages it has not built yet, as the deep side does
    (the site keeps each page it builds)."""
    end = max(urls - round_number * shallow, shallow)
    name = f"tail-{round_number}.xml.gz"
    _write_urlset(directory / name, range(max(end - shallow, 0), end), hosts)
    return name


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[None]:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(
        ("127.0.0.1", SITEMAP_PORT), functools.partial(Quiet, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def page_site(urls: int, hosts: int, log: Path) -> Iterator[None]:
    pages_per_host = -(-urls // hosts)
    with log.open("wb") as out:
        site = subprocess.Popen(
            [sys.executable, "-m", "bench.perf_site", "--hosts", str(hosts), "--pages-per-host",
             str(pages_per_host), "--port", str(SITE_PORT), "--no-sitemaps"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            _wait_for_port(f"127.0.1.1:{SITE_PORT}")
            yield
        finally:
            site.terminate()
            site.wait(timeout=10)


def management(services: Services, path: str) -> Any:
    request = urllib.request.Request(services.management_url + path)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def rabbit_figures(services: Services, namespace: str, expected: int = 0) -> dict[str, float]:
    """The node's memory, the data directory's size and the namespace's messages. The
    management API's figures lag by a few seconds: wait until the queues show `expected`."""
    deadline = time.monotonic() + 60
    while True:
        queues = management(services, "/api/queues")
        messages = sum(q.get("messages", 0) for q in queues if q["name"].startswith(namespace + "."))
        if messages >= expected or time.monotonic() > deadline:
            break
        time.sleep(2)
    node = management(services, f"/api/nodes/{services.node}")
    while "mem_used" not in node and time.monotonic() < deadline:  # a node just started has none yet
        time.sleep(2)
        node = management(services, f"/api/nodes/{services.node}")
    du = subprocess.run(
        ["du", "-sb", str(services.data_dir)], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    return {
        "memory_mb": node["mem_used"] / 1e6,
        "disk_mb": int(du) / 1e6,
        "messages": messages,
    }


def redis_used(settings: Settings) -> int:
    client = connect_redis(settings, OPERATOR)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def produce(env: dict[str, str], run_id: str, sitemap: str, log_dir: Path) -> tuple[int, float, float]:
    """(URLs enqueued, seconds, producer CPU seconds)."""
    children = Children(env, log_dir)
    started = time.monotonic()
    producer = children.start(
        f"producer-{run_id}",
        "-m",
        "producer",
        "--run-id",
        run_id,
        "--sitemap",
        sitemap,
        stdout=subprocess.PIPE,
    )
    assert producer.process.stdout is not None
    summary = producer.process.stdout.read().decode()
    children.reap(producer)
    elapsed = time.monotonic() - started
    if producer.exit_code != 0 or not summary.strip():
        raise RuntimeError(f"producer failed with {producer.exit_code}; see {log_dir}")
    enqueued = int(json.loads(summary.strip().splitlines()[-1])["enqueued_total"])
    return enqueued, elapsed, producer.cpu_s


@dataclass
class Crawl:
    pages: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    each_round: list[float] = field(default_factory=list)  # pages/s

    def add(self, pages: int, elapsed_s: float, cpu_s: float) -> None:
        self.pages += pages
        self.elapsed_s += elapsed_s
        self.cpu_s += cpu_s
        self.each_round.append(round(pages / elapsed_s, 1) if elapsed_s else 0.0)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def cpu_ms_per_page(self) -> float:
        return 1000 * self.cpu_s / self.pages if self.pages else 0.0


def crawl_pages(
    env: dict[str, str], run_id: str, pages: int, workers: int, log_dir: Path
) -> tuple[int, float, float]:
    """Start a worker pool, wait until `pages` more of the run's URLs are accounted, stop it:
    (pages accounted meanwhile, seconds, the pool's CPU seconds)."""
    settings = Settings.from_env(env)
    db.ensure_schema(settings)  # the tally reads the tables before the workers would create them
    with Tally(settings, run_id) as tally:
        before = tally.accounted()
        children = Children(env, log_dir)
        started = time.monotonic()
        children.start(f"worker-{run_id}", "-m", "worker", "--processes", str(workers))
        try:
            while tally.accounted() - before < pages:
                if time.monotonic() - started > 1800:
                    raise RuntimeError(f"workers stalled; see {log_dir}")
                time.sleep(0.2)
            elapsed = time.monotonic() - started
        finally:
            children.stop_all()
        done = tally.accounted() - before
    return done, elapsed, children.cpu_s()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.deep_frontier", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--urls", type=int, default=10_000_000)
    parser.add_argument("--hosts", type=int, default=HOSTS)
    parser.add_argument("--pages", type=int, default=10_000, help="pages crawled per worker round")
    parser.add_argument("--rounds", type=int, default=2, help="deep and shallow rounds, in turn")
    parser.add_argument("--workers", type=int, default=2, help="worker processes in the pool")
    parser.add_argument("--concurrency", type=int, default=8, help="fetches in flight per worker")
    parser.add_argument("--work-dir", type=Path, default=Path("/var/tmp/crawl-deep-bench"))
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("DEEP_DIR", "/var/tmp/crawl-deep"))
    )
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5691/%2f")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6391/0")
    parser.add_argument("--management-url", default="http://127.0.0.1:15691")
    parser.add_argument("--node", default="deep@localhost")
    parser.add_argument("--keep", action="store_true", help="leave the deep queue and keys in place")
    args = parser.parse_args(argv)
    services = Services(
        args.amqp_url, args.redis_url, args.management_url, args.node, args.data_dir / "mnesia"
    )
    if args.amqp_url.endswith(":5672/%2f") or ":6379" in args.redis_url:
        print(
            "deep_frontier: refusing the shared services; start its own with `make deep-up`", file=sys.stderr
        )
        return 2

    sitemaps = args.work_dir / f"sitemaps-{args.urls}-{args.hosts}"
    started = time.monotonic()
    write_sitemaps(sitemaps, args.urls, args.hosts, SHALLOW_URLS)
    print(f"sitemaps ready in {sitemaps} ({time.monotonic() - started:.0f} s)", flush=True)
    log_dir = args.work_dir / f"logs-{secrets.token_hex(3)}"
    log_dir.mkdir(parents=True)

    deep = f"deep{secrets.token_hex(3)}"
    env = {**pipeline_env(deep, args.concurrency), **services.env()}
    settings = Settings.from_env(env)
    results: dict[str, Any] = {"urls": args.urls, "hosts": args.hosts}
    shallow_settings: list[Settings] = []
    try:
        with serving(sitemaps), page_site(args.urls, args.hosts, log_dir / "site.log"):
            idle = rabbit_figures(services, deep)
            redis_before = redis_used(settings)
            enqueued, seconds, cpu_s = produce(
                env, deep, f"http://127.0.0.1:{SITEMAP_PORT}/index.xml", log_dir
            )
            redis_after = redis_used(settings)
            full = rabbit_figures(services, deep, expected=enqueued)
            results["producer"] = {
                "enqueued": enqueued,
                "seconds": round(seconds, 1),
                "urls_per_s": round(enqueued / seconds),
                "cpu_us_per_url": round(1e6 * cpu_s / max(enqueued, 1), 1),
            }
            results["rabbitmq"] = {
                "idle_memory_mb": round(idle["memory_mb"]),
                "memory_mb": round(full["memory_mb"]),
                "idle_disk_mb": round(idle["disk_mb"]),
                "disk_mb": round(full["disk_mb"]),
                "messages": full["messages"],
                "disk_bytes_per_message": round(1e6 * (full["disk_mb"] - idle["disk_mb"]) / max(enqueued, 1)),
                "memory_bytes_per_message": round(
                    1e6 * (full["memory_mb"] - idle["memory_mb"]) / max(enqueued, 1)
                ),
            }
            results["redis"] = {
                "used_memory_mb": round(redis_after / 1e6),
                "bytes_per_url": round((redis_after - redis_before) / max(enqueued, 1), 1),
            }
            print(json.dumps(results), flush=True)

            deep_crawl, shallow_crawl = Crawl(), Crawl()
            for round_number in range(args.rounds):
                deep_crawl.add(*crawl_pages(env, deep, args.pages, args.workers, log_dir))
                shallow = f"{deep}s{round_number}"
                shallow_env = {**pipeline_env(shallow, args.concurrency), **services.env(), "PG_SCHEMA": deep}
                shallow_settings.append(Settings.from_env(shallow_env))
                tail = write_tail(sitemaps, args.urls, args.hosts, SHALLOW_URLS, round_number)
                produce(shallow_env, shallow, f"http://127.0.0.1:{SITEMAP_PORT}/{tail}", log_dir)
                shallow_crawl.add(*crawl_pages(shallow_env, shallow, args.pages, args.workers, log_dir))
                print(
                    f"round {round_number + 1}: deep {deep_crawl.each_round[-1]:.0f} pages/s, "
                    f"shallow {shallow_crawl.each_round[-1]:.0f} pages/s",
                    flush=True,
                )
            results["rabbitmq"]["messages_after_crawl"] = rabbit_figures(services, deep)["messages"]
            results["workers"] = {
                "processes": args.workers,
                "concurrency": args.concurrency,
                "pages_per_round": args.pages,
                "rounds": args.rounds,
                "deep_pages_per_s": round(deep_crawl.pages_per_s, 1),
                "shallow_pages_per_s": round(shallow_crawl.pages_per_s, 1),
                "deep_each_round": deep_crawl.each_round,
                "shallow_each_round": shallow_crawl.each_round,
                "deep_over_shallow": round(deep_crawl.pages_per_s / max(shallow_crawl.pages_per_s, 1e-9), 3),
                "deep_cpu_ms_per_page": round(deep_crawl.cpu_ms_per_page, 2),
                "shallow_cpu_ms_per_page": round(shallow_crawl.cpu_ms_per_page, 2),
            }
    finally:
        for each in shallow_settings:
            remove_pipeline(each)
        if not args.keep:
            remove_pipeline(settings)
    print(json.dumps(results, indent=2))
    print(f"logs in {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
