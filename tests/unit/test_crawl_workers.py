"""How `make crawl` starts its workers: one pool of N by default, at the default fetches in flight."""

from __future__ import annotations

from ops.crawl import parse_args
from ops.crawl_ports import env_for, metrics_ports
from ops.crawl_workers import DEFAULT_WORKERS, POOL_NAME, WorkerLaunch, worker_launches
from shared.settings import DEFAULT_FETCH_CONCURRENCY, Settings


def test_n_workers_are_one_pool_of_n_processes() -> None:
    assert worker_launches(4) == [WorkerLaunch(POOL_NAME, ("--processes", "4"), 4)]
    # The pool's size is --workers, whatever WORKER_PROCESSES says.
    assert worker_launches(3, 8) == [WorkerLaunch(POOL_NAME, ("--processes", "3"), 3)]


def test_separate_workers_are_one_process_each_and_follow_worker_processes() -> None:
    assert worker_launches(3, separate=True) == [
        WorkerLaunch("worker-1", (), 1),
        WorkerLaunch("worker-2", (), 1),
        WorkerLaunch("worker-3", (), 1),
    ]
    assert [launch.processes for launch in worker_launches(2, 4, separate=True)] == [4, 4]


def test_the_command_line_defaults_to_the_benchmark_s_pool() -> None:
    args = parse_args(["--sitemap", "https://a.test/s.xml"])
    assert (args.workers, args.separate_workers) == (DEFAULT_WORKERS, False) == (4, False)
    assert parse_args(["--site", "https://a.test/", "--separate-workers"]).separate_workers


def test_workers_keep_the_default_fetches_in_flight_unless_the_environment_sets_them() -> None:
    """The crawl adds only a metrics port to a worker's environment: FETCH_CONCURRENCY stays
    the user's, or the default of 24 the benchmark found fastest on latency-bound sites."""
    assert DEFAULT_FETCH_CONCURRENCY == 24 == Settings().fetch_concurrency
    env = {"METRICS_PORT": "9100", "RATE_LIMIT_RPS": "2"}
    settings = Settings.from_env(env)
    (pool,) = worker_launches(4)
    own = env_for(pool.name, env, metrics_ports(settings, [pool]))
    assert own == {**env, "METRICS_PORT": "9110"}
    assert Settings.from_env(own).fetch_concurrency == DEFAULT_FETCH_CONCURRENCY
    assert Settings.from_env({**own, "FETCH_CONCURRENCY": "8"}).fetch_concurrency == 8
