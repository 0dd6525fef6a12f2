"""python -m worker: consume the priority, ttl and bulk queues and store what the pages say."""

from __future__ import annotations

import argparse
import logging

from shared.amqp.topology import work_queue
from shared.cli import run_main
from shared.consumer import Subscription, run_consumers
from shared.metrics import start_metrics_server
from shared.postgres import db
from shared.redis.presence import announced
from shared.service_start import PooledService, add_processes_argument, log_stopped, with_command_line
from shared.settings import Settings
from worker.pool import run_pool
from worker.warc.archive import Archive, check_directory
from worker.wiring import build_handler, close_handler, connect_worker_redis, consumer_hooks

log = logging.getLogger(__name__)

# Consumer priorities: the broker offers messages to the priority queue's consumer first, and
# the local buffer is drained in the same order.
SUBSCRIPTION_PRIORITIES = {"priority": 10, "ttl": 5, "bulk": 0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m worker",
        description="Fetch, parse and store the URLs waiting in the work queues. Run as many as "
        "you like, on any machine: the rate limits and the cache are shared through Redis. "
        "Settings come from the environment (see .env.example).",
    )
    parser.add_argument("--concurrency", type=int, help="fetches in flight (default: FETCH_CONCURRENCY)")
    parser.add_argument(
        "--queues",
        metavar="KIND[,KIND]",
        help="the work queues to serve, e.g. 'priority' for a pool dedicated to the priority "
        "queue (default: WORKER_QUEUES, all of priority,ttl,bulk)",
    )
    add_processes_argument(parser, "worker", "WORKER_PROCESSES", each_has="fetches in flight")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = with_command_line(
        Settings.from_env(),
        fetch_concurrency=args.concurrency,
        worker_processes=args.processes,
        worker_queues=None if args.queues is None else queue_kinds(args.queues),
    )
    return SERVICE.start(settings, settings.worker_processes)


def before_fork(settings: Settings) -> None:
    if settings.warc_dir:
        check_directory(settings.warc_dir)  # once, in one line, rather than from every worker forked
    db.ensure_schema(settings)  # once, before the workers exist


def queue_kinds(text: str) -> tuple[str, ...]:
    """--queues priority,ttl: the kinds, as WORKER_QUEUES reads them (checked by validate)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def serve(settings: Settings, *, schema_ready: bool = False) -> int:
    start_metrics_server(settings)
    if not schema_ready:
        db.ensure_schema(settings)
    client = connect_worker_redis(settings)
    handler = build_handler(settings, client)
    ns = settings.crawl_namespace
    subscriptions = [
        Subscription(work_queue(ns, kind), prio)
        for kind, prio in SUBSCRIPTION_PRIORITIES.items()
        if kind in settings.worker_queues
    ]
    log.info(
        "worker %s starting with %d fetches in flight, serving %s",
        settings.worker_id,
        settings.fetch_concurrency,
        ",".join(settings.worker_queues),
    )
    try:
        archive = handler.archive if isinstance(handler.archive, Archive) else None
        # status lists the worker while it runs, and says why its writes wait (a full WARC_DIR)
        with announced(settings, problem=lambda: archive.problem if archive is not None else None):
            code = run_consumers(
                settings,
                "worker",
                subscriptions,
                handler,
                settings.fetch_concurrency,
                consumer_hooks(handler, client),
            )
    finally:
        close_handler(handler)
    log_stopped(log, "worker", settings.worker_id)
    return code


SERVICE = PooledService("worker", serve, run_pool, before_fork)


if __name__ == "__main__":
    run_main("worker", main)
