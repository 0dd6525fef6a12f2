"""python -m worker: consume the priority, ttl and bulk queues and store what the pages say."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import resource

from shared.amqp.topology import work_queue
from shared.cli import configure_logging, exit_code_of, run_main
from shared.consumer import ConsumerHooks, Subscription, run_consumers
from shared.metrics import start_metrics_server
from shared.postgres import db
from shared.redis.deferred_writes import flush
from shared.redis.presence import announced
from shared.settings import Settings
from worker.pool import run_pool
from worker.store.writer import ResultStore
from worker.warc.archive import Archive, check_directory
from worker.wiring import build_handler, connect_worker_redis

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
    parser.add_argument(
        "--processes",
        type=int,
        help="worker processes, forked after start-up by one that supervises them (default: "
        "WORKER_PROCESSES, 1); each has its own fetches in flight",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.from_env()
    if args.concurrency or args.processes or args.queues is not None:
        settings = dataclasses.replace(
            settings,
            fetch_concurrency=args.concurrency or settings.fetch_concurrency,
            worker_processes=args.processes or settings.worker_processes,
            worker_queues=settings.worker_queues if args.queues is None else queue_kinds(args.queues),
        )
        settings.validate()
    if settings.worker_processes == 1:
        configure_logging(settings.log_level, "worker", settings.log_format, settings.worker_id)
        return serve(settings)
    configure_logging(settings.log_level, "worker", settings.log_format, f"{settings.worker_id}-pool")
    if settings.warc_dir:
        check_directory(settings.warc_dir)  # once, in one line, rather than from every worker forked
    db.ensure_schema(settings)  # once, before the workers exist
    return run_pool(
        settings.worker_processes,
        lambda index: exit_code_of("worker", lambda: serve(pool_member(settings, index), schema_ready=True)),
        name_of=lambda index: f"worker {settings.worker_id}-{index}",
    )


def queue_kinds(text: str) -> tuple[str, ...]:
    """--queues priority,ttl: the kinds, as WORKER_QUEUES reads them (checked by validate)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def pool_member(settings: Settings, index: int) -> Settings:
    """Worker `index` of a pool: an id of its own, and the metrics port after the one before."""
    member = dataclasses.replace(
        settings,
        worker_id=f"{settings.worker_id}-{index}",
        metrics_port=settings.metrics_port + index if settings.metrics_port else 0,
    )
    logging.getLogger().handlers.clear()  # the parent's, which name the pool
    configure_logging(member.log_level, "worker", member.log_format, member.worker_id)
    return member


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
                ConsumerHooks(
                    park=handler.parked,
                    # The Redis writes a page leaves for the thread's next command go out when
                    # no message is waiting for it (shared/redis/deferred_writes.py).
                    when_idle=lambda: flush(client),
                    # A worker with nothing else in hand commits its rows at once: no more are
                    # coming to share the transaction (the end of a crawl, a trickle of URLs).
                    when_quiet=handler.store.commit_soon if isinstance(handler.store, ResultStore) else None,
                ),
            )
    finally:
        if isinstance(handler.store, ResultStore):
            handler.store.close()
        if isinstance(handler.archive, Archive):
            handler.archive.close()  # after the last row: the file being written loses its .open
        if handler.handled is not None:
            handler.handled.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    log.info(
        "worker %s stopped: peak_rss_mb=%.1f cpu_s=%.2f",
        settings.worker_id,
        usage.ru_maxrss / 1024,
        usage.ru_utime + usage.ru_stime,
    )
    return code


if __name__ == "__main__":
    run_main("worker", main)
