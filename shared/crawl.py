"""python -m shared.crawl: run a whole crawl on this machine, as separate processes, and account for it.

Starts the dead-letter consumer and N workers, runs the producer, waits until every enqueued URL
is stored, dead-lettered or skipped, stops everything with SIGTERM and prints the accounting.
`--demo` first serves the bundled demo site on loopback addresses and crawls that.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import redis

from shared.accounting import Accounting, Tally, account
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.keys import Keys
from shared.redis_errors import translate_redis_errors
from shared.settings import Settings

STOP_TIMEOUT_S = 30.0
# Short retry delays so that a demo's fail-twice pages finish in seconds, not minutes. The demo
# keeps its Redis keys under a prefix of its own, and starts from an empty response cache so
# that every demo fetches for real and prints the same figures.
DEMO_ENV = {
    "RETRY_DELAYS_S": "0.5,1",
    "RATE_LIMIT_RPS": "20",
    "REDIS_PREFIX": "demo",
    "FETCH_ALLOWLIST": "127.0.0.0/8",  # the demo site is on loopback, which the guard refuses
}


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass
class Processes:
    log_dir: Path
    env: dict[str, str]
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, name: str, module: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.running[name] = process
        return process

    def check_alive(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                raise CrawlFailed(
                    f"{name} exited early with code {process.returncode}; "
                    f"see {self.log_dir / (name + '.log')}"
                )

    def stop_all(self) -> dict[str, int | None]:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        codes: dict[str, int | None] = {}
        for name, process in self.running.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = None
        for log in self._logs:
            log.close()
        return codes


class CrawlFailed(Exception):
    pass


def run_crawl(
    settings: Settings,
    producer_args: list[str],
    workers: int,
    run_id: str,
    env: dict[str, str],
    log_dir: Path,
    timeout_s: float,
    out: IO[str],
) -> int:
    """Run producer, workers and dead-letter consumer; return 0 when every URL is accounted for."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = Processes(log_dir, env)
    started = time.monotonic()
    try:
        procs.start("dlq_consumer", "dlq_consumer", "consume")
        for i in range(workers):
            procs.start(f"worker-{i + 1}", "worker")
        producer = subprocess.run(
            [sys.executable, "-m", "producer", "--run-id", run_id, *producer_args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        (log_dir / "producer.log").write_text(producer.stderr)
        if producer.returncode != 0 or not producer.stdout.strip():
            raise CrawlFailed(
                f"producer failed (exit {producer.returncode}): "
                f"{producer.stderr.strip().splitlines()[-1:] or ''}"
            )
        summary: dict[str, Any] = json.loads(producer.stdout.strip().splitlines()[-1])
        expected = int(summary["enqueued_total"])
        print(
            f"producer: {summary['urls_seen']} URLs seen, {expected} enqueued "
            f"{summary['enqueued']}, {summary['duplicates']} duplicates, "
            f"{sum(summary['invalid'].values())} invalid, "
            f"{len(summary['sitemaps_failed'])} sitemaps failed",
            file=out,
        )
        accounting = wait_until_accounted(settings, run_id, expected, procs, timeout_s, out)
    except CrawlFailed as exc:
        procs.stop_all()
        print(f"crawl failed: {exc}", file=out)
        return 1
    elapsed = time.monotonic() - started
    codes = procs.stop_all()
    print_accounting(accounting, summary, elapsed, codes, log_dir, out)
    clean_exit = all(code == 0 for code in codes.values())
    return 0 if accounting.accounted == expected and clean_exit else 1


def wait_until_accounted(
    settings: Settings, run_id: str, expected: int, procs: Processes, timeout_s: float, out: IO[str]
) -> Accounting:
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    with Tally(settings, run_id) as tally:
        while (accounted := tally.accounted()) < expected:
            if time.monotonic() > deadline:
                raise CrawlFailed(f"timed out with {accounted} of {expected} URLs accounted for")
            procs.check_alive()
            if time.monotonic() - last_report > 2:
                last_report = time.monotonic()
                accounting = account(settings, run_id)
                print(
                    f"  ... stored {accounting.stored}, dead letters {accounting.dead}, "
                    f"skipped {accounting.skipped} of {expected}",
                    file=out,
                    flush=True,
                )
            time.sleep(0.25)
    return account(settings, run_id)


def print_accounting(
    a: Accounting,
    summary: dict[str, Any],
    elapsed_s: float,
    codes: dict[str, int | None],
    log_dir: Path,
    out: IO[str],
) -> None:
    expected = int(summary["enqueued_total"])
    dead = ", ".join(f"{reason} {n}" for reason, n in a.dead_by_reason.items()) or "none"
    skips = ", ".join(f"{reason} {n}" for reason, n in a.skips_by_reason.items()) or "none"
    mark = "ok" if a.accounted == expected else "MISMATCH"
    stopped = ", ".join(f"{name}={code}" for name, code in codes.items())
    print(
        f"\nrun {a.run_id}\n"
        f"  enqueued          {expected:6d}   {summary['enqueued']}\n"
        f"  duplicates        {summary['duplicates']:6d}   (not enqueued)\n"
        f"  pages stored      {a.stored:6d}   ({a.stored_after_retry} after retries, "
        f"{a.from_cache} from the cache)\n"
        f"  dead letters      {a.dead:6d}   ({dead})\n"
        f"  skipped           {a.skipped:6d}   ({skips})\n"
        f"  accounted for     {a.accounted:6d} of {expected}: {mark}\n"
        f"  retries           {a.retries:6d}\n"
        f"  cache hits        {a.from_cache:6d}\n"
        f"  elapsed           {elapsed_s:6.1f} s\n"
        f"  processes stopped with exit codes: {stopped}\n"
        f"  logs in {log_dir}/",
        file=out,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shared.crawl", description=__doc__)
    parser.add_argument("--demo", action="store_true", help="serve and crawl the bundled demo site")
    parser.add_argument("--sitemap", action="append", default=[], help="sitemap URL (repeatable)")
    parser.add_argument("--site", action="append", default=[], help="site root: read its robots.txt")
    parser.add_argument("--urls", action="append", default=[], help="file of URLs, one per line")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--run-id", default="")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the crawl")
    parser.add_argument("--log-dir", default="var/log", help="where the processes' logs go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    if args.demo:
        env = {**DEMO_ENV, **env}
    settings = Settings.from_env(env)
    configure_logging(settings.log_level, "crawl", settings.log_format)
    producer_args = [
        *_repeat("--sitemap", args.sitemap),
        *_repeat("--site", args.site),
        *_repeat("--urls", args.urls),
    ]
    if not producer_args and not args.demo:
        raise ConfigError("nothing to crawl: give --sitemap, --site, --urls or --demo")
    if args.workers < 1:
        raise ConfigError("--workers: must be at least 1")
    run_id = args.run_id or new_run_id("demo" if args.demo else "run")
    log_dir = Path(args.log_dir) / run_id
    if not args.demo:
        return run_crawl(
            settings, producer_args, args.workers, run_id, env, log_dir, args.timeout, sys.stdout
        )
    from demo_site.runner import serve_demo_site

    forget_cached_responses(settings)

    with serve_demo_site(log_dir, env) as site_root:
        print(
            f"demo site: serving {site_root} (and two more loopback hosts); "
            f"requests logged to {log_dir}/site-requests.jsonl"
        )
        return run_crawl(
            settings,
            ["--site", site_root, *producer_args],
            args.workers,
            run_id,
            env,
            log_dir,
            args.timeout,
            sys.stdout,
        )


def forget_cached_responses(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5)
    try:
        with translate_redis_errors(settings.redis_url):
            keys = list(client.scan_iter(Keys(settings.redis_prefix).cache("*"), count=1000))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def _repeat(flag: str, values: list[str]) -> list[str]:
    return [item for value in values for item in (flag, value)]


if __name__ == "__main__":
    run_main("crawl", main)
