"""python -m bench.producer_marks [--urls N] [--rounds R] [--before DIR]: what a kill -9 of the
producer would leave to be published twice, and the producer's CPU per URL.

Runs the producer alone on a file of N loopback URLs (no worker), and every 20 ms samples the
messages in the run's work queues minus the run's `enqueued` counter: the URLs the broker holds
that the producer has not yet marked seen. A kill at that moment leaves each of them to the next
run, which publishes it again (docs/RELIABILITY.md); the mean over the publish is what a kill at a
random point costs. CPU is the producer process's user + system seconds (wait4), per URL.

With `--before DIR` (a source tree of another version, e.g. made with
`git archive <commit> | tar -x -C DIR`; repeatable, labelled by the directory's name), the versions
take turns, R rounds each, so the
machine's load falls on both alike. Every run uses fresh queue and key names and removes them.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from ops.teardown import remove_pipeline
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.redis.keys import Keys
from shared.settings import Settings

SAMPLE_EVERY_S = 0.02
HERE = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    cpu_us_per_url: float
    wall_s: float
    unmarked_mean: float
    unmarked_max: int


def env_for(name: str) -> dict[str, str]:
    return {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "LOG_LEVEL": "WARNING",
    }


class Sampler:
    """In a thread: queued messages minus the run's enqueued counter, every SAMPLE_EVERY_S."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self._settings = settings
        self._stats_key = Keys(settings.redis_prefix).run_stats(run_id)
        self._queues = build_topology(settings).work_queues()
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        connection = broker.connect(self._settings, "bench-producer-marks")
        client = redis.Redis.from_url(self._settings.redis_url)
        try:
            channel = connection.channel()
            while not self._stop.wait(SAMPLE_EVERY_S):
                queued = sum(broker.queue_depth(channel, queue)[0] for queue in self._queues)
                stats: dict[bytes, bytes] = client.hgetall(self._stats_key)  # type: ignore[assignment]
                enqueued = sum(int(n) for k, n in stats.items() if k.startswith(b"enqueued."))
                self.samples.append(queued - enqueued)
        finally:
            client.close()
            connection.close()


def run_once(tree: Path, urls_file: Path) -> Result:
    name = f"benchmarks{secrets.token_hex(4)}"
    env = env_for(name)
    settings = Settings.from_env(env)
    connection = broker.connect(settings, "bench-producer-marks")
    try:
        broker.declare_topology(connection, build_topology(settings))  # sampled from the start
    finally:
        connection.close()
    try:
        with Sampler(settings, name) as sampler:
            started = time.monotonic()
            process = subprocess.Popen(
                [sys.executable, "-m", "producer", "--run-id", name, "--urls", str(urls_file)],
                cwd=tree,  # the tree's own packages come first on sys.path
                env={**env, "PYTHONPATH": str(tree)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            wall_s = time.monotonic() - started
        if process.returncode != 0:
            raise SystemExit(f"the producer in {tree} exited with {process.returncode}")
        urls = sum(1 for _ in urls_file.open())
        busy = [n for n in sampler.samples if n > 0] or [0]
        return Result(
            cpu_us_per_url=(usage.ru_utime + usage.ru_stime) / urls * 1e6,
            wall_s=wall_s,
            unmarked_mean=statistics.fmean(sampler.samples or [0]),
            unmarked_max=max(busy),
        )
    finally:
        remove_pipeline(settings)


def describe(label: str, results: list[Result]) -> str:
    cpu = [r.cpu_us_per_url for r in results]
    return (
        f"{label:<14} CPU µs/URL median {statistics.median(cpu):6.1f} (runs: "
        + ", ".join(f"{c:.1f}" for c in cpu)
        + f"); wall s median {statistics.median(r.wall_s for r in results):5.2f}; unmarked in the "
        f"queues: mean {statistics.fmean(r.unmarked_mean for r in results):7.0f}, "
        f"max {max(r.unmarked_max for r in results):6d}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.producer_marks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--urls", type=int, default=50_000, help="URLs to publish per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each version")
    parser.add_argument(
        "--before", type=Path, action="append", default=[], help="a source tree to compare with (repeatable)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        urls_file = Path(tmp) / "urls.txt"
        urls_file.write_text("".join(f"http://127.0.0.1:9/page/{i}\n" for i in range(args.urls)))
        trees = {"this": HERE, **{tree.name: tree.resolve() for tree in args.before}}
        results: dict[str, list[Result]] = {label: [] for label in trees}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                results[label].append(run_once(tree, urls_file))
    print(f"{args.urls:,} URLs a run, {args.rounds} rounds; figures are noisy on a shared machine")
    for label, runs in results.items():
        print(describe(label, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
