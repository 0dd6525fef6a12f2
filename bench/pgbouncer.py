"""python -m bench.pgbouncer: a pool of worker processes writing to PostgreSQL directly, then
through PgBouncer in transaction mode (`make pgbouncer-up` first), in alternating rounds.

Each run crawls the fast local site (bench/perf_site.py) with the dead-letter consumer and one
worker pool of WORKER_PROCESSES processes, until every URL is accounted for. Meanwhile a
sampler counts the server connections PostgreSQL holds for the benchmark's own database
(pg_stat_activity), and the table shows the most seen at once. Every run uses fresh queue, key
and schema names and removes them afterwards. The figures are as noisy as the machine is busy:
compare rounds, not single runs.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from bench.measure import Children, proc_cpu_s
from bench.perf import CPU_CONCURRENCY, perf_site, pipeline_env
from ops.accounting import Tally, account
from ops.teardown import remove_pipeline
from shared.settings import Settings

# Of its own, so that pg_stat_activity counts only the benchmark's; named for this run (the
# services create it on first use) and dropped when the run ends.
DATABASE = f"crawler_pgbbench_{secrets.token_hex(4)}"
DIRECT_URL = f"postgresql://postgres@127.0.0.1:5432/{DATABASE}"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
SAMPLE_EVERY_S = 0.2


@dataclass(frozen=True)
class Run:
    topology: str
    pages: int
    elapsed_s: float
    cpu_s: float  # our processes: producer, worker pool, dead-letter consumer
    pooler_cpu_s: float  # PgBouncer's process, 0 for direct connections
    server_connections: int  # most PostgreSQL backends on the benchmark database at once

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed_s


class ConnectionSampler:
    """The most backends PostgreSQL holds for `database` at once, sampled every `every_s` on a
    thread of its own over a connection to another database (so it does not count itself)."""

    def __init__(self, database: str = DATABASE, every_s: float = SAMPLE_EVERY_S) -> None:
        self.most = 0
        self._database = database
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            while not self._stop.is_set():
                query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                row = conn.execute(query, (self._database,))
                self.most = max(self.most, int(row.fetchone()[0]))  # type: ignore[index]
                self._stop.wait(self._every_s)


def drop_database(name: str) -> None:
    """Drop a database made for one run, if it exists. FORCE ends the server connections
    PgBouncer still holds open to it, which would otherwise make PostgreSQL refuse the drop."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def pgbouncer_pid(port: int) -> int:
    """Our PgBouncer's process (deploy/local/pgbouncer.sh writes the file)."""
    pidfile = Path(f"/tmp/crawl-pgbouncer-{port}/pgbouncer.pid")
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        raise SystemExit(f"no PgBouncer pid in {pidfile}: start it with `make pgbouncer-up`") from None


def run_once(
    topology: str, env_extra: dict[str, str], processes: int, sitemap: str, log_dir: Path, pooler_pid: int
) -> Run:
    name = f"pgb{secrets.token_hex(4)}"
    env = pipeline_env(name, CPU_CONCURRENCY, WORKER_PROCESSES=str(processes), **env_extra)
    settings = Settings.from_env(env)
    run_log = log_dir / name
    run_log.mkdir(parents=True)
    children = Children(env, run_log)
    pooler_before = proc_cpu_s(pooler_pid) if pooler_pid else 0.0
    started = time.monotonic()
    try:
        with ConnectionSampler() as sampler:
            children.start("dlq_consumer", "-m", "dlq_consumer")
            children.start("worker", "-m", "worker")
            producer = children.start(
                "producer", "-m", "producer", "--run-id", name, "--sitemap", sitemap, stdout=subprocess.PIPE
            )
            assert producer.process.stdout is not None
            summary = producer.process.stdout.read().decode()
            children.reap(producer)
            if producer.exit_code != 0 or not summary.strip():
                raise RuntimeError(f"producer failed with {producer.exit_code}; see {run_log}")
            expected = int(json.loads(summary.strip().splitlines()[-1])["enqueued_total"])
            with Tally(settings, name) as tally:
                while tally.accounted() < expected:
                    if time.monotonic() - started > 900:
                        raise RuntimeError(f"timed out; see {run_log}")
                    time.sleep(0.1)
            elapsed = time.monotonic() - started
            final = account(settings, name)
            pooler_cpu_s = proc_cpu_s(pooler_pid) - pooler_before if pooler_pid else 0.0
    finally:
        children.stop_all()
        remove_pipeline(settings)
    if final.accounted != expected or final.stored != expected:
        raise RuntimeError(f"{topology}: {final.stored} stored of {expected}; see {run_log}")
    return Run(topology, final.stored, elapsed, children.cpu_s(), pooler_cpu_s, sampler.most)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pgbouncer", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=16, help="worker processes in the pool")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--pages-per-host", type=int, default=1500)
    parser.add_argument("--pgbouncer-port", type=int, default=6432)
    parser.add_argument("--site-port", type=int, default=8541)
    args = parser.parse_args(argv)
    topologies = {
        "direct": {"DATABASE_URL": DIRECT_URL},
        "pgbouncer": {
            "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{args.pgbouncer_port}/{DATABASE}",
            "DATABASE_POOLER": "transaction",
        },
    }
    pooler_pid = pgbouncer_pid(args.pgbouncer_port)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-pgbouncer-") as tmp:
        log_dir = Path(tmp)
        with perf_site(args.hosts, args.pages_per_host, 0, log_dir, port=args.site_port):
            sitemap = f"http://127.0.1.1:{args.site_port}/sitemap_index.xml"
            try:
                for round_no in range(1, args.rounds + 1):
                    for topology, extra in topologies.items():
                        pid = pooler_pid if topology == "pgbouncer" else 0
                        run = run_once(topology, extra, args.processes, sitemap, log_dir, pid)
                        runs.append(run)
                        print(
                            f"round {round_no} {topology:9s} {run.pages} pages {run.pages_per_s:6.1f} "
                            f"pages/s {run.cpu_s / run.pages * 1000:5.1f} CPU-ms/page "
                            f"(PgBouncer {run.pooler_cpu_s / run.pages * 1000:4.2f}) "
                            f"{run.server_connections:3d} server connections",
                            flush=True,
                        )
            finally:
                drop_database(DATABASE)
    print(
        f"\n{'topology':10s} {'pages/s (each round)':24s} {'CPU-ms/page':>11s} "
        f"{'PgBouncer CPU-ms/page':>21s} {'server conns (max)':>18s}"
    )
    for topology in topologies:
        mine = [r for r in runs if r.topology == topology]
        rates = ", ".join(f"{r.pages_per_s:.0f}" for r in mine)
        pages = sum(r.pages for r in mine)
        cpu_ms = sum(r.cpu_s for r in mine) / pages * 1000
        pooler_ms = sum(r.pooler_cpu_s for r in mine) / pages * 1000
        conns = max(r.server_connections for r in mine)
        print(f"{topology:10s} {rates:24s} {cpu_ms:11.1f} {pooler_ms:21.2f} {conns:18d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
