"""python -m renderer: consume the render queue, load each page in Chromium, store what it says.

A renderer is a worker whose fetch is a browser: the same handler (robots.txt, the domain gate,
retries, defer queues, dead letters), the same writer and rows, the same metrics. What differs
is the Fetch (renderer/engine.py) and that it keeps no response cache: a cached copy is the
unrendered shell a worker fetched.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

import redis

from renderer.chromium import require_chromium
from renderer.engine import RenderEngine, RenderFetch
from renderer.figures import RunRenderFigures, RunsInHand, counted_by_run
from renderer.watchdog import Watchdog
from shared import metrics
from shared.amqp.topology import render_queue
from shared.cli import run_main
from shared.consumer import Subscription, run_consumers
from shared.http.netguard import AddressGuard, address_policy
from shared.metrics import start_metrics_server
from shared.postgres import db
from shared.redis.keys import Keys
from shared.redis.presence import announced
from shared.service_start import PooledService, add_processes_argument, log_stopped, with_command_line
from shared.settings import Settings
from worker.fetch.response import CacheEntry, Response
from worker.handler import CrawlHandler
from worker.pool import run_pool
from worker.wiring import HttpFetch, build_handler, close_handler, connect_worker_redis, consumer_hooks

log = logging.getLogger(__name__)


class NoCache:
    """The renderer's Cache: nothing is read or kept."""

    def get(self, url: str) -> CacheEntry | None:
        return None

    def read_ahead(self, url: str) -> None:
        pass

    def drop_read_ahead(self) -> None:
        pass

    def put(self, url: str, response: Response) -> bool:
        return False


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m renderer",
        description="Load the pages waiting in the render queue in Chromium (CHROMIUM_PATH), with "
        "every request the page makes through the address guard, and store what the rendered "
        "page says. Run as many as you like. Settings come from the environment (.env.example).",
    )
    parser.add_argument("--concurrency", type=int, help="pages in flight (default: RENDER_CONCURRENCY)")
    add_processes_argument(parser, "renderer", "RENDERER_PROCESSES", each_has="browser")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = with_command_line(
        Settings.from_env(), render_concurrency=args.concurrency, renderer_processes=args.processes
    )
    require_chromium(settings.chromium_path)
    return SERVICE.start(settings, settings.renderer_processes)


def build_renderer(
    settings: Settings, engine: RenderEngine, client: redis.Redis, runs: RunsInHand
) -> CrawlHandler:
    """The worker's handler with a browser for its fetch and no response cache; each render
    counted in the figures of the run in hand (renderer/figures.py)."""
    handler = build_handler(settings, client)
    assert isinstance(handler.fetch, HttpFetch)
    count = counted_by_run(runs, RunRenderFigures(client, Keys(settings.redis_prefix)))
    return dataclasses.replace(
        handler, fetch=RenderFetch(engine, handler.fetch.robots_txt, count), cache=NoCache()
    )


def serve(settings: Settings, *, schema_ready: bool = False) -> int:
    # One handler thread per page in flight; the writer batches as many rows.
    settings = dataclasses.replace(settings, fetch_concurrency=settings.render_concurrency)
    start_metrics_server(settings)
    if not schema_ready:
        db.ensure_schema(settings)
    client = connect_worker_redis(settings)
    watchdog = Watchdog.start()
    engine = RenderEngine(settings, AddressGuard(address_policy(settings)), watchdog).start()
    runs = RunsInHand()
    handler = build_renderer(settings, engine, client, runs)
    metrics.BROWSER_RSS_BYTES.set_function(engine.browser_memory_bytes)
    log.info(
        "renderer %s starting with %d pages in flight, chromium at %s",
        settings.worker_id,
        settings.render_concurrency,
        settings.chromium_path,
    )
    try:
        with announced(settings):
            code = run_consumers(
                settings,
                "renderer",
                [Subscription(render_queue(settings.crawl_namespace), 0)],
                runs.around(handler),
                settings.render_concurrency,
                consumer_hooks(handler, client),
            )
    finally:
        close_handler(handler)
        engine.close()
        watchdog.stop()
    log_stopped(log, "renderer", settings.worker_id)
    return code


SERVICE = PooledService("renderer", serve, run_pool, before_fork=db.ensure_schema)  # the schema, once


if __name__ == "__main__":
    run_main("renderer", main)
