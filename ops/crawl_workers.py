"""How `ops.crawl` lays out its workers on one machine: by default as one pool.

`--workers N` starts one `python -m worker --processes N`, supervised as `worker-pool`: it
imports once and forks N workers (worker/pool.py), starts again a worker of its own that dies,
and ops/crawl_processes.py starts the whole pool again if its parent dies. Each worker keeps
FETCH_CONCURRENCY fetches in flight (DEFAULT_FETCH_CONCURRENCY unless the environment says
otherwise). On the benchmark's 2-core machine that layout crawled fastest: a pool of 4 x 24 on
a site answering in 100 ms, and on real pages a pool spent less CPU a page than as many separate
processes, which each pay the interpreter's start-up and imports (docs/PERFORMANCE.md).

`--separate-workers` starts N lone `python -m worker` processes instead, `worker-1` ...
`worker-N`, each with a log of its own and restarted one by one; WORKER_PROCESSES then applies
to each of them, as it does to any `python -m worker`.

The benchmark builds its row for `make crawl` from `worker_launches`, so it measures this path.
"""

from __future__ import annotations

from dataclasses import dataclass

POOL_NAME = "worker-pool"
# The benchmark's pool of 4: on 2 cores, 4 x 24 fetches in flight kept both busy (8 made no more).
DEFAULT_WORKERS = 4


@dataclass(frozen=True)
class WorkerLaunch:
    """One process of `python -m worker` (or of `python -m renderer`, a worker whose fetch is a
    browser: ops/crawl_renderers.py) that the crawl starts and supervises."""

    name: str  # in the crawl's lines ("worker-pool started again") and its log file's name
    args: tuple[str, ...]  # after `python -m <module>`
    processes: int  # worker processes it runs: a pool's size, else WORKER_PROCESSES (1)
    module: str = "worker"


def worker_launches(workers: int, worker_processes: int = 1, *, separate: bool = False) -> list[WorkerLaunch]:
    """The worker processes of a crawl of `workers` workers. `worker_processes`: the
    environment's WORKER_PROCESSES, which only separate workers follow (each forks that many)."""
    if separate:
        return [WorkerLaunch(f"worker-{k}", (), worker_processes) for k in range(1, workers + 1)]
    return [WorkerLaunch(POOL_NAME, ("--processes", str(workers)), workers)]
