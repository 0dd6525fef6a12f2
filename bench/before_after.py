"""python -m bench.before_after: the pipeline of an earlier commit beside this tree's, in the same
run, on the same local sites: pages/s and CPU a stored page, each side's rounds interleaved.

For a change that should cost nothing (a restructuring of the code), this says whether it did:
each round crawls the same site once with the earlier commit's services and once with this
tree's, in alternating order (before then after, then after then before, ...), so the machine's
drift over minutes falls on both sides alike. The earlier commit is checked out once as a git
worktree of its own (`--before`, default the commit before the consumer loop and the handler
were last reorganised) under /tmp, and its services run from there with this tree's .venv: the
same libraries, only the project's code differs.

Two crawls, as `make bench`'s first two rows lay them out (bench/perf.py): latency-bound (20
hosts answering in 100 ms, a pool of 4 workers x 24 fetches in flight) and CPU-bound (the same
hosts answering at once, 4 x 8). Figures are the totals of all rounds: pages/s, CPU of the
pipeline's own processes a stored page (producer, workers, dead-letter consumer), CPU of
RabbitMQ, Redis and PostgreSQL a page (noisy on a shared machine: others' work lands there too),
and the ratio after/before of each. CPU time is the steadier figure on a loaded machine; the
wall clock moves with whatever else runs. Every run uses fresh queue, key and schema names and
removes them afterwards. Needs the local RabbitMQ, Redis and PostgreSQL.
"""

from __future__ import annotations

import argparse
import collections
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import Children, services_cpu_s, services_delta, services_delta_by_name
from bench.perf import CPU_CONCURRENCY, LATENCY_CONCURRENCY, SITE_PORT, perf_site, pipeline_env
from ops.crawl_workers import worker_launches
from ops.teardown import remove_pipeline
from shared.postgres import db
from shared.settings import Settings

# The commit before the consumer loop became three objects and the handler held its parts.
BEFORE = "ac93bdc"
ROUNDS = 3
WORKERS = 4
TREE = Path(__file__).resolve().parent.parent

# Counted from the tables every version has (the per-run counters are newer than some commits).
ACCOUNTED = """
SELECT (SELECT count(*) FROM pages WHERE run_id = %(run)s)
     + (SELECT count(*) FROM dead_letters WHERE run_id = %(run)s AND state = 'dead')
     + (SELECT count(*) FROM skips WHERE run_id = %(run)s),
       (SELECT count(*) FROM pages WHERE run_id = %(run)s)
"""


@dataclass(frozen=True)
class Crawl:
    pages: int
    elapsed_s: float
    own_cpu_s: float
    services_cpu_s: float
    # Our processes' CPU seconds by process (the producer, the worker pool, the dead-letter
    # consumer): where a change in the "own processes" row comes from.
    own_by_process: dict[str, float] = field(default_factory=dict)
    # The services' by service (beam.smp, redis-server, postgres).
    services_by_name: dict[str, float] = field(default_factory=dict)

    def __add__(self, other: Crawl) -> Crawl:
        return Crawl(
            self.pages + other.pages,
            self.elapsed_s + other.elapsed_s,
            self.own_cpu_s + other.own_cpu_s,
            self.services_cpu_s + other.services_cpu_s,
            _summed(self.own_by_process, other.own_by_process),
            _summed(self.services_by_name, other.services_by_name),
        )

    def share_ms(self, name: str) -> float:
        """CPU a page of one of our processes or of one service, by name."""
        spent = self.own_by_process.get(name, self.services_by_name.get(name, 0.0))
        return 1000 * spent / self.pages

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed_s

    @property
    def own_ms(self) -> float:
        return 1000 * self.own_cpu_s / self.pages

    @property
    def services_ms(self) -> float:
        return 1000 * self.services_cpu_s / self.pages


def _summed(one: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    total = collections.Counter(one)
    total.update(other)
    return dict(total)


def checkout(commit: str) -> Path:
    """A worktree of `commit` under /tmp, made on first use and kept for the next run."""
    sha = subprocess.run(
        ["git", "-C", str(TREE), "rev-parse", "--short", commit], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"crawl-bench-{sha}"
    if not (path / "worker" / "__main__.py").exists():
        subprocess.run(
            ["git", "-C", str(TREE), "worktree", "add", "--detach", str(path), sha],
            check=True,
            capture_output=True,
            text=True,
        )
    return path


def crawl(tree: Path, producer_args: list[str], concurrency: int, log_dir: Path) -> Crawl:
    """One crawl with the services of `tree`: the dead-letter consumer, a pool of WORKERS workers
    as `make crawl` starts them, and the producer; timed until every URL is accounted."""
    name = f"bench{secrets.token_hex(4)}"
    # The side's code first on the path, from its own folder: `python -m worker` there imports it.
    env = {**pipeline_env(name, concurrency), "PYTHONPATH": str(tree)}
    settings = Settings.from_env(env)
    run_log = log_dir / name
    run_log.mkdir(parents=True)
    children = Children(env, run_log, cwd=tree)
    before = services_cpu_s()
    started = time.monotonic()
    try:
        children.start("dlq_consumer", "-m", "dlq_consumer")
        for launch in worker_launches(WORKERS):
            children.start(launch.name, "-m", "worker", *launch.args)
        producer = children.start(
            "producer", "-m", "producer", "--run-id", name, *producer_args, stdout=subprocess.PIPE
        )
        assert producer.process.stdout is not None
        summary = producer.process.stdout.read().decode()
        children.reap(producer)
        if producer.exit_code != 0 or not summary.strip():
            raise RuntimeError(f"producer of {tree} failed with {producer.exit_code}; see {run_log}")
        expected = int(json.loads(summary.strip().splitlines()[-1])["enqueued_total"])
        deadline = time.monotonic() + 900
        with db.connect(settings, autocommit=True) as conn:
            while True:
                counted = conn.execute(ACCOUNTED, {"run": name}).fetchone() or (0, 0)
                accounted, stored = int(str(counted[0])), int(str(counted[1]))
                if accounted >= expected:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out: {accounted} of {expected} accounted; see {run_log}")
                time.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        children.stop_all()
        after = services_cpu_s()
        remove_pipeline(settings)
    by_process = {child.name: child.cpu_s for child in children.finished}
    return Crawl(
        stored,
        elapsed,
        children.cpu_s(),
        services_delta(before, after),
        by_process,
        services_delta_by_name(before, after),
    )


def interleaved(
    rounds: int, sides: dict[str, Path], run: Callable[[Path], Crawl]
) -> tuple[dict[str, Crawl], list[str]]:
    """Each side once a round, the order turned round every round; totals and each round's pages/s."""
    totals: dict[str, Crawl] = {}
    each = []
    names = list(sides)
    for i in range(rounds):
        order = names if i % 2 == 0 else names[::-1]
        figures = {name: run(sides[name]) for name in order}
        for name, result in figures.items():
            totals[name] = totals[name] + result if name in totals else result
        each.append("/".join(f"{figures[name].pages_per_s:.0f}" for name in names))
    return totals, each


def table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("figure", "before", "after", "after/before")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def compared(label: str, before: Crawl, after: Crawl, each: list[str]) -> list[tuple[str, str, str, str]]:
    rate = after.pages_per_s / before.pages_per_s
    return [
        (f"{label}: pages/s (rounds, before/after: {', '.join(each)})",
         f"{before.pages_per_s:.0f}", f"{after.pages_per_s:.0f}", f"{rate:.3f}"),
        ("  CPU a page, own processes",
         f"{before.own_ms:.2f} ms", f"{after.own_ms:.2f} ms", f"{after.own_ms / before.own_ms:.3f}"),
        *_shares(before, after, sorted(before.own_by_process)),
        ("  CPU a page, RabbitMQ+Redis+PostgreSQL",
         f"{before.services_ms:.2f} ms", f"{after.services_ms:.2f} ms",
         f"{after.services_ms / before.services_ms:.3f}"),
        *_shares(before, after, sorted(before.services_by_name)),
    ]  # fmt: skip


def _shares(before: Crawl, after: Crawl, names: list[str]) -> list[tuple[str, str, str, str]]:
    return [
        (f"    of which {name}", f"{before.share_ms(name):.2f} ms", f"{after.share_ms(name):.2f} ms",
         f"{after.share_ms(name) / max(before.share_ms(name), 1e-9):.3f}")
        for name in names
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.before_after", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--before", default=BEFORE, help=f"the earlier commit (default {BEFORE})")
    parser.add_argument(
        "--after", default=None, help="a later commit, checked out the same way (default: this tree)"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="crawls of each side per site")
    parser.add_argument("--pages", type=int, default=5000, help="pages of each site (20 hosts)")
    parser.add_argument("--only", default="latency,cpu", help="comma list of the crawls: latency, cpu")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.pages < 20:
        parser.error("--rounds must be at least 1 and --pages at least 20")
    try:
        sides = {"before": checkout(args.before), "after": checkout(args.after) if args.after else TREE}
    except subprocess.CalledProcessError as exc:
        print(f"bench.before_after: cannot check out {exc.cmd[-1]!r}: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    after_name = args.after or "this tree"
    log_dir = Path(tempfile.mkdtemp(prefix="bench-before-after-"))
    print(f"before: {sides['before']}  after: {sides['after']}  logs in {log_dir}", flush=True)
    per_host = args.pages // 20
    rows: list[tuple[str, str, str, str]] = []
    urls = log_dir / "urls.txt"
    subprocess.run(
        [sys.executable, "-m", "bench.perf_site", "--hosts", "20", "--pages-per-host", str(per_host),
         "--port", str(SITE_PORT), "--write-urls", str(urls)],
        check=True,
    )  # fmt: skip
    crawls = (("latency", 100, LATENCY_CONCURRENCY), ("cpu", 0, CPU_CONCURRENCY))
    for section, delay_ms, concurrency in crawls:
        if section not in args.only.split(","):
            continue

        def run(tree: Path, concurrency: int = concurrency) -> Crawl:
            return crawl(tree, ["--urls", str(urls)], concurrency, log_dir)

        with perf_site(20, per_host, delay_ms, log_dir):  # the same site for both sides
            totals, each = interleaved(args.rounds, sides, run)
        label = f"{'latency' if delay_ms else 'CPU'}-bound, {per_host * 20} pages, 4 x {concurrency}"
        rows += compared(label, totals["before"], totals["after"], each)
        print(table(rows), flush=True)
    print()
    print(f"{args.rounds} rounds, sides interleaved; before = {args.before}, after = {after_name}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
