"""python -m bench.politeness: do N worker processes keep each host under its rate, and near it?

Serves a local site on one loopback address (or --hosts of them, 127.0.0.2 and up), enqueues
more URLs per host than RATE x DURATION allows with the producer, runs --workers `python -m
worker` processes against it for --duration seconds, then reads the site's own request log:

    per host: the most requests in any 1-second sliding window   (must be <= rate)
              the requests in the first DURATION seconds          (should be >= 90% of rate x duration)

Every run uses fresh names (CRAWL_NAMESPACE, REDIS_PREFIX, PG_SCHEMA) and removes its queues,
keys and schema at the end. Needs the local RabbitMQ, Redis and PostgreSQL. Exit code 0 when
every host met both figures.
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
from pathlib import Path

from bench.site import Hit, LoggedSite, most_in_any_window, pages_route
from shared.redis.client import OPERATOR, connect_redis
from shared.settings import Settings

STOP_TIMEOUT_S = 40.0
FIRST_REQUEST_TIMEOUT_S = 60.0
URL_MARGIN = 1.3  # URLs per host beyond what the rate allows, so no host ever runs dry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.politeness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument("--rate", type=float, default=5.0, help="RATE_LIMIT_RPS per host (default 5)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds measured (default 60)")
    parser.add_argument("--hosts", type=int, default=1, help="loopback hosts served (default 1; try 20)")
    parser.add_argument(
        "--concurrency", type=int, default=0, help="fetches in flight per worker (default FETCH_CONCURRENCY)"
    )
    parser.add_argument("--log-dir", default="", help="keep the processes' logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rate <= 0 or args.duration <= 0 or not 1 <= args.hosts <= 200:
        parser.error("need --workers >= 1, --rate > 0, --duration > 0 and 1 <= --hosts <= 200")
    return args


def addresses(hosts: int) -> list[str]:
    return ["127.0.0.1"] if hosts == 1 else [f"127.0.0.{n}" for n in range(2, hosts + 2)]


def bench_env(args: argparse.Namespace, name: str) -> dict[str, str]:
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "RATE_LIMIT_RPS": str(args.rate),
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
    }
    if args.concurrency:
        env["FETCH_CONCURRENCY"] = str(args.concurrency)
    return env


def write_urls(site: LoggedSite, per_host: int, path: Path) -> int:
    """Interleaved by host, so that every host has work from the start of the queue."""
    lines = [site.url(f"/p/{n}", address) for n in range(per_host) for address in site.addresses]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def run(args: argparse.Namespace) -> int:
    name = f"bench{secrets.token_hex(4)}"
    env = bench_env(args, name)
    settings = Settings.from_env(env)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="politeness-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    per_host = math.ceil(args.rate * args.duration * URL_MARGIN) + 10
    workers: list[subprocess.Popen[bytes]] = []
    with LoggedSite(pages_route, addresses(args.hosts)) as site:
        try:
            for i in range(args.workers):
                log = (log_dir / f"worker-{i + 1}.log").open("wb")
                workers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
            # Measure workers at work, not Python starting up: enqueue once all are consuming.
            wait_for_consumers(settings, workers)
            total = write_urls(site, per_host, log_dir / "urls.txt")
            producer = subprocess.run(
                [sys.executable, "-m", "producer", "--urls", str(log_dir / "urls.txt"), "--run-id", name],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if producer.returncode != 0:
                print(f"producer failed: {producer.stderr.strip()[-2000:]}", file=sys.stderr)
                return 2
            enqueued = json.loads(producer.stdout.strip().splitlines()[-1]).get("enqueued_total", total)
            print(
                f"{args.workers} workers, {len(site.addresses)} host(s) at {args.rate:g} req/s each, "
                f"{enqueued} URLs enqueued; measuring {args.duration:g} s ...",
                file=sys.stderr,
            )
            first = wait_for_first_hit(site, workers)
            time.sleep(max(0.0, first + args.duration + 1.0 - time.monotonic()))
        finally:
            stop(workers)
        hits = site.hits
        domains = site.domains()
    cleanup(settings)
    with (log_dir / "site-hits.jsonl").open("w", encoding="utf-8") as out:
        for hit in hits:
            out.write(json.dumps({"at": hit.at, "domain": hit.domain, "path": hit.path}) + "\n")
    print(f"logs and the site's request log (site-hits.jsonl): {log_dir}", file=sys.stderr)
    return report(hits, domains, args.rate, args.duration)


def wait_for_consumers(
    settings: Settings, workers: list[subprocess.Popen[bytes]], consumers: int | None = None
) -> None:
    """Until `consumers` (default: one per process of `workers`; a pool has more) consume."""
    from shared.amqp import broker
    from shared.amqp.topology import work_queue

    queue = work_queue(settings.crawl_namespace, "bulk")
    connection = broker.connect(settings, "bench-wait")
    try:
        deadline = time.monotonic() + FIRST_REQUEST_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(worker.poll() is not None for worker in workers):
                raise SystemExit("a worker exited early; see its log")
            channel = connection.channel()
            with contextlib.suppress(*broker.CONNECTION_ERRORS):  # not declared yet
                if broker.queue_depth(channel, queue)[1] >= (consumers or len(workers)):
                    return
            if channel.is_open:
                channel.close()
            time.sleep(0.2)
        raise SystemExit("the workers did not all start consuming within a minute")
    finally:
        connection.close()


def wait_for_first_hit(site: LoggedSite, workers: list[subprocess.Popen[bytes]]) -> float:
    deadline = time.monotonic() + FIRST_REQUEST_TIMEOUT_S
    while time.monotonic() < deadline:
        hits = site.hits
        if hits:
            return min(hit.at for hit in hits)
        if any(worker.poll() is not None for worker in workers):
            raise SystemExit("a worker exited early; see its log")
        time.sleep(0.05)
    raise SystemExit("no request reached the site within a minute")


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for worker in workers:
        try:
            worker.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def report(hits: list[Hit], domains: list[str], rate: float, duration_s: float) -> int:
    bound = math.floor(rate)
    target = 0.9 * rate * duration_s
    failures = 0
    worst_window = 0
    total_in_run = 0
    print(f"{'host':<22} {'max/1s':>7} {'bound':>6} {'in run':>7} {'>= 90%':>7}")
    for domain in domains:
        times = sorted(hit.at for hit in hits if hit.domain == domain)
        if not times:
            print(f"{domain:<22} no requests")
            failures += 1
            continue
        window = most_in_any_window(times, 1.0)
        in_run = sum(1 for t in times if t < times[0] + duration_s)
        worst_window = max(worst_window, window)
        total_in_run += in_run
        ok = window <= bound and in_run >= target
        failures += not ok
        print(f"{domain:<22} {window:>7} {bound:>6} {in_run:>7} {target:>7.1f} {'ok' if ok else 'FAIL'}")
    print(
        f"\nmax requests in any 1-s window (any host): {worst_window}  (bound {bound})\n"
        f"requests in the first {duration_s:g} s: {total_in_run}  "
        f"(90% of {rate:g} x {duration_s:g} x {len(domains)} host(s) = {target * len(domains):.1f})\n"
        f"{'PASS' if failures == 0 else f'FAIL ({failures} host(s))'}"
    )
    return 0 if failures == 0 else 1


def cleanup(settings: Settings) -> None:
    """Remove the queues, exchanges, Redis keys and schema made under this run's names."""
    with contextlib.suppress(Exception):
        from shared.amqp import broker
        from shared.amqp.topology import build_topology

        connection = broker.connect(settings, "bench-cleanup")
        channel = connection.channel()
        topology = build_topology(settings)
        for queue in topology.queues:
            channel.queue_delete(queue.name)
        for exchange in topology.exchanges:
            channel.exchange_delete(exchange.name)
        connection.close()
    with contextlib.suppress(Exception):
        client = connect_redis(settings, OPERATOR)
        keys = list(client.scan_iter(f"{settings.redis_prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()
    with contextlib.suppress(Exception):
        import psycopg
        from psycopg import sql

        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.pg_schema))
            )


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
