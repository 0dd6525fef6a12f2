"""python -m ops.crawl: run a whole crawl on this machine, as separate processes, and account for it.

Starts the dead-letter consumer and N workers, as one pool of N processes with
FETCH_CONCURRENCY (24 by default) fetches in flight each (ops/crawl_workers.py), and renderers
when the crawl renders pages (RENDER=auto, or a routing rule with render = "always":
ops/crawl_renderers.py), runs the producer, waits until every URL the run has enqueued is
stored, dead-lettered or skipped, stops everything with SIGTERM and prints the accounting.
Meanwhile it shows progress: a live line on a terminal, a line every --progress-every seconds
elsewhere. A worker (or renderer) that dies is started again: by its pool, and the pool by
ops/crawl_processes.py.
Ctrl-C, or SIGTERM, stops the processes and prints the accounting so far (exit 130, or 143 for
SIGTERM); the same command with the same --run-id finishes the run. A blip of Redis or
PostgreSQL shows "?" in the progress line; only one that lasts OUTAGE_LIMIT_S ends the crawl
(ops/run_watch.py). With METRICS_PORT set, each process serves its metrics on a port of its
own (ops/crawl_ports.py), named when the crawl starts. `--demo` first serves the bundled demo
site on loopback addresses and crawls that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from demo_site.runner import serve_demo_site
from ops.accounting import account
from ops.crawl_ports import describe, env_for, metrics_ports
from ops.crawl_processes import (
    STOP_TIMEOUT_S,
    CrawlFailed,
    Processes,
    StopRequest,
    Terminated,
    last_line,
    sigterm_as_interrupt,
    stop_signals_ignored,
)
from ops.crawl_renderers import renderer_launches, renderers_line
from ops.crawl_report import print_accounting, producer_line, what_stays
from ops.crawl_workers import DEFAULT_WORKERS, worker_launches
from ops.run_delete import delete_run
from ops.run_watch import RunWatch
from producer.discovery_args import DiscoveryArgs, add_discovery_arguments
from producer.discovery_scope import DiscoveryOptions
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.http.netguard import check_url
from shared.postgres import db
from shared.progress import EVERY_S, ProgressDisplay, Rate, Snapshot, live_detail, periodic_line
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.redis.runstate import CANCELLED, PAUSED
from shared.settings import Settings

__all__ = ["CrawlFailed", "Processes", "main", "run_crawl"]  # Processes: tests start services with it

# Short retry delays so that a demo's fail-twice pages finish in seconds, not minutes. The demo
# keeps its Redis keys under a prefix of its own, and starts from an empty response cache so
# that every demo fetches for real and prints the same figures.
DEMO_ENV = {
    "RETRY_DELAYS_S": "0.5,1",
    "RATE_LIMIT_RPS": "20",
    "REDIS_PREFIX": "demo",
    "FETCH_ALLOWLIST": "127.0.0.0/8",  # the demo site is on loopback, which the guard refuses
}
POLL_S = 0.25
DISCOVERY_QUIET_S = 2.0  # a discovery run's count unchanged this long, no links waiting: done
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_TERMINATED = 143  # SIGTERM: 128 + its number, as for the producer


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_crawl(
    settings: Settings,
    producer_args: list[str],
    workers: int,
    run_id: str,
    env: dict[str, str],
    log_dir: Path,
    timeout_s: float,
    out: IO[str],
    *,
    progress_every_s: float = EVERY_S,
    live: bool | None = None,
    separate_workers: bool = False,
    discovering: bool = False,
    quiet_s: float = 0.0,  # a discovery run's: DISCOVERY_QUIET_S unless given
    renderers: int | None = None,  # renderer processes if the crawl renders; None: RENDERER_PROCESSES
) -> int:
    """Run producer, `workers` workers (one pool, or as many processes with `separate_workers`)
    and the dead-letter consumer; return 0 when every URL the run has enqueued (this time and
    any time before under the same run id) is accounted for."""
    log_dir.mkdir(parents=True, exist_ok=True)
    db.ensure_schema(settings)  # before the first count, which may come before any worker is up
    display = ProgressDisplay(out, run_id, live=live, every_s=progress_every_s)
    procs = Processes(log_dir, env, say=display.note)
    child_settings = Settings.from_env(env)
    launches = worker_launches(workers, child_settings.worker_processes, separate=separate_workers)
    launches += renderer_launches(child_settings, renderers)
    ports = metrics_ports(child_settings, launches)
    if ports:
        print(describe(ports, launches, child_settings.metrics_host), file=out)
    if rendering := renderers_line(
        child_settings, launches[-1:] if launches[-1].module == "renderer" else []
    ):
        print(rendering, file=out)
    started = time.monotonic()
    with sigterm_as_interrupt() as stop_request, RunWatch(settings, run_id) as watch:
        state = watch.state()
        if state == CANCELLED:
            raise ConfigError(f"run {run_id!r} was cancelled; start a new run (another --run-id)")
        if state == PAUSED:
            print(
                f"run {run_id} is paused: nothing is fetched until `python -m ops.runs resume {run_id}`",
                file=out,
            )
        summary: dict[str, Any] | None = None
        codes: dict[str, int | None] | None = None
        try:
            with display:
                procs.start(
                    "dlq_consumer", "dlq_consumer", "consume", env=env_for("dlq_consumer", env, ports)
                )
                for launch in launches:
                    procs.start(
                        launch.name, launch.module, *launch.args, env=env_for(launch.name, env, ports)
                    )
                if discovering:  # follows the links workers send (producer/frontier_service.py)
                    procs.start("frontier", "producer", "--frontier", env=env_for("frontier", env, ports))
                producer = start_producer(run_id, producer_args, env_for("producer", env, ports), log_dir)
                procs.adopt("producer", producer)
                summary = wait_until_accounted(
                    watch,
                    producer,
                    log_dir,
                    procs,
                    display,
                    timeout_s,
                    stop_request,
                    discovering,
                    quiet_s or DISCOVERY_QUIET_S,
                )
                elapsed = time.monotonic() - started
        except CrawlFailed as exc:
            codes = procs.stop_all()
            print(f"crawl failed: {exc}", file=out)
            print(what_stays(watch, run_id), file=out)
            return 1
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
            terminated = isinstance(stop, Terminated)
            with stop_signals_ignored():
                print(
                    f"{'terminated (SIGTERM)' if terminated else 'interrupted'}: stopping the processes "
                    f"(at most {STOP_TIMEOUT_S:.0f} s)",
                    file=out,
                    flush=True,
                )
                elapsed = time.monotonic() - started
                codes = procs.stop_all(signalled_too=not terminated)
            summary = summary or summary_if_any(log_dir)  # the producer prints one when stopped
            a = account(settings, run_id)
            print_accounting(a, watch, summary, elapsed, codes, log_dir, out, finished=False)
            print(what_stays(watch, run_id), file=out)
            return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        finally:
            if codes is None:  # whatever happened, no process outlives the crawl
                codes = procs.stop_all()
        accounting = account(settings, run_id)
        expected = print_accounting(accounting, watch, summary, elapsed, codes, log_dir, out)
        print(f"see it live: make dashboard, then http://127.0.0.1:8080/runs/{run_id}", file=out)
    clean_exit = all(code == 0 for code in codes.values())
    return 0 if accounting.accounted == expected and clean_exit else 1


def start_producer(
    run_id: str, args: list[str], env: dict[str, str], log_dir: Path
) -> subprocess.Popen[bytes]:
    """The producer, its JSON summary going to producer-summary.json and its log to producer.log.
    Not restarted: a producer that fails says why, and the crawl fails with its line."""
    with (
        (log_dir / "producer-summary.json").open("wb") as summary,
        (log_dir / "producer.log").open("ab") as log,
    ):
        return subprocess.Popen(
            [sys.executable, "-m", "producer", "--run-id", run_id, *args], env=env, stdout=summary, stderr=log
        )


def summary_if_any(log_dir: Path) -> dict[str, Any] | None:
    """The producer's summary, if it printed one (a producer stopped by Ctrl-C does)."""
    try:
        text = (log_dir / "producer-summary.json").read_text().strip()
        summary: dict[str, Any] = json.loads(text.splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return summary


def producer_summary(producer: subprocess.Popen[bytes], log_dir: Path) -> dict[str, Any]:
    text = (log_dir / "producer-summary.json").read_text().strip()
    if producer.returncode != 0 or not text:
        raise CrawlFailed(
            f"producer failed (exit {producer.returncode}): "
            f"{last_line(log_dir / 'producer.log') or 'no output'}; see {log_dir / 'producer.log'}"
        )
    summary: dict[str, Any] = json.loads(text.splitlines()[-1])
    return summary


def wait_until_accounted(
    watch: RunWatch,
    producer: subprocess.Popen[bytes],
    log_dir: Path,
    procs: Processes,
    display: ProgressDisplay,
    timeout_s: float,
    stop_request: StopRequest | None = None,
    discovering: bool = False,
    quiet_s: float = 0.0,
) -> dict[str, Any]:
    """Supervise and show progress until the producer has finished and every URL the run has
    enqueued is accounted for; return the producer's summary. Raises KeyboardInterrupt (or
    Terminated) once `stop_request` has noted Ctrl-C (or SIGTERM).

    A discovery run's total grows while pages are stored: it is done once, besides, no links
    wait for the frontier and the count has stayed put for `quiet_s`. (A page's links
    are on their way between its row's commit and its ack for milliseconds: a run ended in that
    moment is finished by the same command with the same --run-id.)"""
    deadline = time.monotonic() + timeout_s
    quiet = Quiet(quiet_s if discovering else 0.0)
    rate = Rate()
    summary: dict[str, Any] | None = None
    snapshot: Snapshot | None = None  # the last one read
    while True:
        if stop_request is not None:
            stop_request.raise_if_stopped()  # before supervise() starts again what the stop ended
        procs.supervise()
        if summary is None and producer.poll() is not None:
            summary = producer_summary(producer, log_dir)
            display.note(producer_line(summary))
        # A discovery run's total grows until its end: its ETA is a lower bound (">") throughout.
        found = watch.snapshot_if_reachable(producing=summary is None or discovering)
        if found is None:  # Redis or PostgreSQL away for now: asked again at the next poll
            unknown = f"? of ? done (waiting for {watch.unreachable})"
            display.show(snapshot.done if snapshot else 0, None, unknown, unknown)
        else:
            snapshot = found
            per_s = rate.add(snapshot)
            display.show(
                snapshot.done, snapshot.total, live_detail(snapshot, per_s), periodic_line(snapshot, per_s)
            )
            all_done = summary is not None and snapshot.done >= snapshot.total
            if all_done and discovering and watch.links_waiting() != 0:
                all_done = False
            if quiet.held(all_done, (snapshot.done, snapshot.total)) and summary is not None:
                return summary
        if time.monotonic() > deadline:
            done = f"{snapshot.done} of {snapshot.total}" if snapshot else "an unknown number of the"
            raise CrawlFailed(f"timed out with {done} URLs accounted for")
        time.sleep(POLL_S)


class Quiet:
    """True once a condition has held, with the same figures, for `hold_s` (at once for 0)."""

    def __init__(self, hold_s: float) -> None:
        self._hold_s = hold_s
        self._since: float | None = None
        self._figures: object = None

    def held(self, condition: bool, figures: object) -> bool:
        if not condition:
            self._since = None
            return False
        now = time.monotonic()
        if self._since is None or figures != self._figures:
            self._since, self._figures = now, figures
        return now - self._since >= self._hold_s


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.crawl", description=__doc__)
    parser.add_argument("--demo", action="store_true", help="serve and crawl the bundled demo site")
    parser.add_argument("--sitemap", action="append", default=[], help="sitemap URL (repeatable)")
    parser.add_argument("--site", action="append", default=[], help="site root: read its robots.txt")
    parser.add_argument("--urls", action="append", default=[], help="file of URLs, one per line")
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="worker processes, forked by one pool (worker/pool.py), each with FETCH_CONCURRENCY "
        f"fetches in flight (default: {DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--renderers",
        type=int,
        default=None,
        metavar="N",
        help="renderer processes (python -m renderer, one Chromium each) when the crawl renders "
        'pages: RENDER=auto or a routing rule with render = "always" (default: RENDERER_PROCESSES, '
        "1); 0 starts none, for renderers that run elsewhere",
    )
    parser.add_argument(
        "--separate-workers",
        action="store_true",
        help="start each worker as a process of its own (python -m worker) instead of one pool",
    )
    parser.add_argument(
        "--run-id", default="", help="name of the run; an interrupted run's id finishes that run"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start --run-id from nothing: delete its rows, Redis keys and hold queue first "
        "(as `python -m ops.runs delete`; refused while it has URLs queued or held)",
    )
    parser.add_argument(
        "--recrawl-of",
        default="",
        metavar="RUN_ID",
        help="an earlier run of the same site: URLs whose sitemap says they have not changed "
        "since that run fetched them are not fetched again",
    )
    parser.add_argument(
        "--progress-every",
        type=float,
        default=EVERY_S,
        metavar="S",
        help="seconds between progress lines when the output is not a terminal",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the crawl")
    parser.add_argument("--log-dir", default="var/log", help="where the processes' logs go")
    add_discovery_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    if args.demo:
        env = {**DEMO_ENV, **env}
    settings = Settings.from_env(env)
    configure_logging(settings.log_level, "crawl", settings.log_format)
    producer_args = producer_arguments(args)
    discovery = DiscoveryArgs.from_namespace(args)
    if not (args.sitemap or args.site or args.urls or discovery.start_urls) and not args.demo:
        raise ConfigError("nothing to crawl: give --sitemap, --site, --urls, --start or --demo")
    # Checked here too, so that a mistake is one line before any process starts.
    DiscoveryOptions.checked(
        discovery.start_urls,
        discovery.max_depth,
        discovery.scope,
        discovery.include,
        discovery.exclude,
        discovery.max_pages,
        discovery.max_pages_per_host,
        check_address=check_url(settings),
    )
    if args.workers < 1:
        raise ConfigError("--workers: must be at least 1")
    renderer_launches(settings, args.renderers)  # --renderers and CHROMIUM_PATH: one line now
    if args.progress_every <= 0:
        raise ConfigError("--progress-every: must be more than 0 seconds")
    if args.fresh and not args.run_id:
        raise ConfigError("--fresh: give the --run-id to start again (a new run starts fresh anyway)")
    run_id = args.run_id or new_run_id("demo" if args.demo else "run")
    if args.fresh:
        forget_run(settings, run_id)
    log_dir = Path(args.log_dir) / run_id
    with served_demo_site(args.demo, settings, log_dir, env) as site_args:
        return run_crawl(
            settings,
            [*site_args, *producer_args],
            args.workers,
            run_id,
            env,
            log_dir,
            args.timeout,
            sys.stdout,
            progress_every_s=args.progress_every,
            separate_workers=args.separate_workers,
            discovering=discovery.discovers,
            renderers=args.renderers,
        )


@contextlib.contextmanager
def served_demo_site(
    demo: bool, settings: Settings, log_dir: Path, env: dict[str, str]
) -> Iterator[list[str]]:
    """With --demo, the bundled demo site served for the length of the crawl, and the producer
    arguments that crawl it; otherwise nothing is served and no argument is added."""
    if not demo:
        yield []
        return
    forget_cached_responses(settings)
    with serve_demo_site(log_dir, env) as site_root:
        print(
            f"demo site: serving {site_root} (and two more loopback hosts); "
            f"requests logged to {log_dir}/site-requests.jsonl"
        )
        yield ["--site", site_root]


def forget_run(settings: Settings, run_id: str) -> None:
    client = connect_redis(settings, OPERATOR)
    try:
        deleted = delete_run(settings, client, Keys(settings.redis_prefix), run_id, force=False)
    finally:
        client.close()
    print(f"run {run_id}: starting fresh ({deleted.rows} rows and {deleted.keys} Redis keys deleted)")


def forget_cached_responses(settings: Settings) -> None:
    client = connect_redis(settings, OPERATOR)
    try:
        with translate_redis_errors(settings.redis_url):
            keys = list(client.scan_iter(Keys(settings.redis_prefix).cache("*"), count=1000))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def producer_arguments(args: argparse.Namespace) -> list[str]:
    """What the crawl passes on to `python -m producer` (besides --run-id)."""
    return [
        *_repeat("--sitemap", args.sitemap),
        *_repeat("--site", args.site),
        *_repeat("--urls", args.urls),
        *(["--recrawl-of", args.recrawl_of] if args.recrawl_of else []),
        *(discovery.as_flags() if (discovery := DiscoveryArgs.from_namespace(args)).discovers else []),
    ]


def _repeat(flag: str, values: list[str]) -> list[str]:
    return [item for value in values for item in (flag, value)]


if __name__ == "__main__":
    run_main("crawl", main)
