"""What a run's page and the runs list cost to read on a big run: p95 of each, from the per-run
counters (run_counters), beside the count(*) queries they replaced.

`python -m bench.run_page_cost [--pages 1000000] [--dead 100000] [--runs 60] [--repeat 40]`
builds, in a PostgreSQL schema of its own (dropped at the end), one run of PAGES stored pages
and DEAD dead letters, plus RUNS small runs for the list, all with plain SQL (generate_series),
written through the triggers a worker's rows go through, in transactions of a worker's size
or so. Pages are spread over the last two hours, so the rate window holds some. Then it reads,
straight after the build and again after a vacuum of run_counters:

- run page: what ops.status --run and the dashboard's run page read from PostgreSQL and Redis
  (ops.accounting.account_on, the replayed count, ops.run_progress.ProgressReader.read);
- runs list: ops.accounting.latest_runs(50);
- for comparison, the count(*) queries that ops.accounting ran before the counters;
- what the counters cost a worker's commit: STORE_PAGES for 200-row batches, with the
  triggers and with them disabled (in this schema only), in µs a row.

It checks the figures are exact (the counters against count(*)) and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ops.accounting import account_on, latest_runs
from ops.run_progress import ProgressReader
from ops.status import REPLAYED_OF_RUN
from shared.postgres import db
from shared.settings import Settings
from worker.store.rows import STORE_PAGES, PageRow, page_params

RUN = "bench-big"
CHUNK_ROWS = 2_000  # rows per transaction while building: a few worker batches' worth
# What ops.accounting asked before the counters, for comparison.
COUNT_STAR = (
    "SELECT count(*), count(*) FILTER (WHERE from_cache), count(*) FILTER (WHERE failed_attempts > 0),"
    " coalesce(sum(failed_attempts), 0), count(*) FILTER (WHERE writes > 1) FROM pages WHERE run_id = %s",
    "SELECT reason, count(*) FROM dead_letters WHERE run_id = %s AND state = 'dead' GROUP BY reason",
    "SELECT reason, count(*) FROM skips WHERE run_id = %s GROUP BY reason",
)
INSERT_PAGES = """
INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id, failed_attempts, fetched_at)
SELECT %(run)s, 'https://bench.test/p' || g, 'https://bench.test/p' || g, 200, 'bulk', 'w' || (g %% 8),
       (g %% 10 = 0)::int, now() - make_interval(secs => 7200.0 * (%(total)s - g) / %(total)s)
FROM generate_series(%(first)s::int, %(last)s::int) AS g
"""
INSERT_DEAD = """
INSERT INTO dead_letters (run_id, url, reason, attempts, body, last_failed_at)
SELECT %(run)s, 'https://bench.test/d' || g, (ARRAY['http_500', 'http_404', 'timeout'])[1 + g %% 3], 3,
       '\\x7b7d'::bytea, now() - make_interval(secs => 7200.0 * (%(total)s - g) / %(total)s)
FROM generate_series(%(first)s::int, %(last)s::int) AS g
"""


def build(conn: psycopg.Connection[Any], pages: int, dead: int, runs: int) -> float:
    started = time.perf_counter()
    for statement, count in ((INSERT_PAGES, pages), (INSERT_DEAD, dead)):
        for first in range(1, count + 1, CHUNK_ROWS):
            last = min(count, first + CHUNK_ROWS - 1)
            with conn.transaction():
                conn.execute(statement, {"run": RUN, "first": first, "last": last, "total": count})
    for n in range(runs):
        with conn.transaction():
            conn.execute(INSERT_PAGES, {"run": f"bench-small-{n}", "first": 1, "last": 100, "total": 100})
    conn.execute("ANALYZE")
    return time.perf_counter() - started


def writer_us_per_row(
    conn: psycopg.Connection[Any], batches: int = 10, rows: int = 200, rounds: int = 7
) -> dict[str, float]:
    """What a worker's commit costs a row, with the counting triggers and without: STORE_PAGES for
    batches of `rows` (a full writer batch), as worker/store/writer.py sends them."""

    def batch(run: str, first: int) -> list[dict[str, Any]]:
        return [
            page_params(
                PageRow(
                    run,
                    f"https://w.test/{n}",
                    f"https://w.test/{n}",
                    200,
                    "text/html",
                    "t",
                    None,
                    None,
                    None,
                    None,
                    "text " * 200,
                    [],
                    "bulk",
                    0,
                    False,
                    5,
                    "w",
                )
            )
            for n in range(first, first + rows)
        ]

    # Rounds alternate, and each figure is the median of its rounds: on a shared machine one
    # round can take twice another.
    taken: dict[str, list[float]] = {"with_counters": [], "without_counters": []}
    for round_ in range(rounds):
        for label in taken:
            conn.execute(
                f"ALTER TABLE pages {'ENABLE' if label == 'with_counters' else 'DISABLE'} TRIGGER USER"
            )
            prepared = [batch(f"bench-writer-{round_}-{label}", b * rows) for b in range(batches)]
            started = time.perf_counter()
            for params in prepared:
                STORE_PAGES.execute(conn, params)
            taken[label].append((time.perf_counter() - started) * 1e6 / (batches * rows))
    conn.execute("ALTER TABLE pages ENABLE TRIGGER USER")  # this schema's only
    return {label: round(statistics.median(times), 1) for label, times in taken.items()}


def p95_ms(read: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        read()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.quantiles(times, n=20)[-1], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_page_cost", description=__doc__)
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=60, help="small runs besides the big one")
    parser.add_argument("--repeat", type=int, default=40, help="reads of each kind measured")
    args = parser.parse_args(argv)
    schema = f"bench_runpage_{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env({"PG_SCHEMA": schema, "REDIS_PREFIX": schema})
    db.ensure_schema(settings)
    try:
        with db.connect(settings, autocommit=True) as conn:
            build_s = build(conn, args.pages, args.dead, args.runs)
            with ProgressReader(settings) as reader:

                def run_page() -> None:
                    account_on(conn, RUN)
                    conn.execute(REPLAYED_OF_RUN, (RUN,)).fetchone()
                    reader.read(RUN)

                def count_star() -> None:
                    for query in COUNT_STAR:
                        conn.execute(query, (RUN,)).fetchall()

                run_page()  # connections opened, plans cached
                figures: dict[str, Any] = {
                    "pages": args.pages,
                    "dead_letters": args.dead,
                    "runs": args.runs + 1,
                    "build_s": round(build_s, 1),
                }
                # Straight after the build, and once a vacuum (autovacuum's, within a minute on a
                # live crawl) has cleared the counter rows' dead versions the build left.
                for when in ("built", "vacuumed"):
                    figures[when] = {
                        "run_page_p95_ms": p95_ms(run_page, args.repeat),
                        "runs_list_p95_ms": p95_ms(lambda: latest_runs(conn, 50), args.repeat),
                        "count_star_p95_ms": p95_ms(count_star, max(5, args.repeat // 8)),
                    }
                    conn.execute("VACUUM ANALYZE run_counters")
                figures["pages_per_s_now"] = round(reader.read(RUN).pages_per_s, 1)
                figures["writer_us_per_row"] = writer_us_per_row(conn)
            exact = account_on(conn, RUN)
            counted = conn.execute(COUNT_STAR[0], (RUN,)).fetchone()
            dead = conn.execute(COUNT_STAR[1], (RUN,)).fetchall()
            assert counted is not None
            figures["exact"] = (
                exact.stored == counted[0] == args.pages
                and exact.stored_after_retry == counted[2]
                and exact.dead_by_reason == {str(r): int(str(n)) for r, n in dead}
                and exact.dead == args.dead
            )
        print(json.dumps(figures), flush=True)
        return 0 if figures["exact"] else 1
    finally:
        with db.connect(settings, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    raise SystemExit(main())
