"""python -m bench.handled_check --without DIR [--pages N] [--rounds R]: what the worker's
handled check (worker/handling/handled.py: one script call before each fetch, one pipelined mark after)
costs per page, against a source tree whose worker has it off.

Make the tree without it from this one, e.g.:

    git archive HEAD | tar -x -C /tmp/nocheck
    sed -i 's/handled=HandledMarks(client, keys),/handled=None,/' /tmp/nocheck/worker/wiring.py

Each round crawls the local benchmark site (bench/perf_site.py, 20 loopback hosts, no delay)
once with each tree, in turns, with a fresh run: one worker, the dead-letter consumer, the
producer. Per stored page it prints the worker's CPU (user + system, wait4), Redis's CPU and the
commands Redis executed (INFO commandstats) in all and by kind. Redis is shared: other clients'
commands and CPU fall into the figures too, so they are noisy, on both sides alike; the figures
that differ by the check alone are `evalsha` and `hset`.

`--one-run` (used by the rounds) crawls once with the tree the command runs in and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.measure import Children, redis_cpu_s
from bench.perf import pipeline_env
from ops.accounting import Tally, account
from ops.teardown import remove_pipeline
from shared.redis.keys import Keys
from shared.settings import Settings

HOSTS = 20
WATCHED = ("evalsha", "hget", "hset", "hincrby", "get", "set")


def command_counts(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def one_run(pages_per_host: int) -> dict[str, Any]:
    port = random.randint(20000, 40000)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        site_log = (log_dir / "site.log").open("wb")
        site_args = ["--hosts", str(HOSTS), "--pages-per-host", str(pages_per_host), "--port", str(port)]
        site = subprocess.Popen(
            [sys.executable, "-m", "bench.perf_site", *site_args, "--delay-ms", "0"],
            stdout=site_log,
            stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(2.0)  # the site binds its 20 addresses
            return crawl(f"http://127.0.1.1:{port}/sitemap_index.xml", log_dir)
        finally:
            site.terminate()
            site.wait(timeout=10)
            site_log.close()


def crawl(sitemap: str, log_dir: Path) -> dict[str, Any]:
    name = f"bench{secrets.token_hex(4)}"
    env = pipeline_env(name, 8)
    settings = Settings.from_env(env)
    client = redis.Redis.from_url(settings.redis_url)
    children = Children(env, log_dir)
    commands_before, cpu_before = command_counts(client), redis_cpu_s()
    try:
        children.start("dlq_consumer", "-m", "dlq_consumer")
        worker = children.start("worker", "-m", "worker")
        producer = children.start("producer", "-m", "producer", "--run-id", name, "--sitemap", sitemap)
        children.reap(producer)
        if producer.exit_code != 0:
            raise SystemExit(f"the producer failed ({producer.exit_code}); see {log_dir}")
        with Tally(settings, name) as tally:
            stats: dict[bytes, bytes] = client.hgetall(Keys(settings.redis_prefix).run_stats(name))  # type: ignore[assignment]
            expected = sum(int(n) for k, n in stats.items() if k.startswith(b"enqueued."))
            deadline = time.monotonic() + 600
            while tally.accounted() < expected and time.monotonic() < deadline:
                time.sleep(0.1)
        commands_after, cpu_after = command_counts(client), redis_cpu_s()
        stored = account(settings, name).stored
        children.stop_all()
    finally:
        client.close()
        remove_pipeline(settings)
    delta = {k: commands_after.get(k, 0) - commands_before.get(k, 0) for k in commands_after}
    return {
        "pages": stored,
        "worker_cpu_s": worker.cpu_s,
        "redis_cpu_s": cpu_after - cpu_before,
        "commands": sum(delta.values()),
        **{f"cmd_{k}": delta.get(k, 0) for k in WATCHED},
    }


def run_in(tree: Path, pages_per_host: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.handled_check", "--one-run", "--pages", str(pages_per_host * HOSTS)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def describe(label: str, runs: list[dict[str, Any]]) -> str:
    def per_page(key: str, scale: float = 1.0) -> float:
        return float(statistics.median(r[key] / r["pages"] * scale for r in runs))

    watched = ", ".join(f"{k} {per_page('cmd_' + k):.2f}" for k in WATCHED)
    each = ", ".join(f"{r['worker_cpu_s'] / r['pages'] * 1e3:.2f}" for r in runs)
    return (
        f"{label:<10} pages {runs[0]['pages']}; per page: worker CPU {per_page('worker_cpu_s', 1e3):.2f} ms "
        f"(runs: {each}), "
        f"Redis CPU {per_page('redis_cpu_s', 1e6):.0f} µs, "
        f"Redis commands {per_page('commands'):.2f} ({watched})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.handled_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pages", type=int, default=4000, help="pages a crawl (split over 20 hosts)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--without", type=Path, help="a source tree whose worker has no handled check")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    pages_per_host = max(1, args.pages // HOSTS)
    if args.one_run:
        print(json.dumps(one_run(pages_per_host)))
        return 0
    if args.without is None:
        parser.error("--without DIR is required (see the module docstring)")
    trees = {"with": Path(__file__).resolve().parent.parent, "without": args.without.resolve()}
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            results[label].append(run_in(tree, pages_per_host))
    print(f"{args.rounds} rounds, in turns; figures are noisy (a shared machine and a shared Redis)")
    for label, runs in results.items():
        print(describe(label, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
