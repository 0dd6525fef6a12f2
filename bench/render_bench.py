"""The cost of rendering: pages/s, CPU a page and peak memory on script-built pages, three ways.

    python -m bench.render_bench [--pages 200] [--concurrency 4]

  * `renderer`: python -m renderer behind a routing rule `render = "always"`, the whole pipeline
    (producer, RabbitMQ, Redis, PostgreSQL, the dead-letter consumer);
  * `scrapy-playwright`: the same pages through scrapy-playwright driving the same chromium,
    with as many pages in flight, waiting for network idle as the renderer does;
  * `worker`: a plain worker on the same site, which stores the shells: the floor.

The pages are bench/script_site.py's `/p/<n>`, cycling over content and links built by scripts,
a page that opens popups and one that navigates away. CPU is that of the process and every
process below it (the Playwright driver, Chromium), read from /proc just before it stops, so a
browser process that ended earlier is not in it; peak memory is the highest sum of PSS over the
same tree, sampled every 0.25 s. Rows are printed as `make bench` prints its own.
Needs a RabbitMQ, Redis and PostgreSQL on localhost (names of its own, removed afterwards), and
the bench extra for the scrapy-playwright row.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.script_site import SITE_HOST, Canary, ScriptSite
from ops.accounting import account
from ops.teardown import remove_pipeline
from renderer.processes import descendants, proportional_bytes
from shared.postgres import db
from shared.settings import Settings

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.25


@dataclass
class Row:
    name: str
    pages: int
    elapsed_s: float
    cpu_s: float
    peak_mb: float

    def line(self) -> str:
        pages_per_s = self.pages / self.elapsed_s if self.elapsed_s else 0.0
        cpu_ms = 1000 * self.cpu_s / self.pages if self.pages else 0.0
        return (
            f"{self.name:<20} {self.pages:6d} pages  {pages_per_s:7.2f} pages/s  "
            f"{cpu_ms:8.1f} ms CPU/page  {self.peak_mb:8.1f} MB peak"
        )


def cpu_s_of(pid: int) -> float:
    """User and system time of `pid` and what it has reaped; 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            text = stat_file.read().decode("ascii", "replace")
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2 :].split()
    return sum(int(value) for value in fields[11:15]) / TICKS_PER_S


class TreeSampler:
    """Samples the memory and CPU of a process and everything below it, until stopped."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.peak_mb = 0.0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        pids = [self._pid, *(p.pid for p in descendants(self._pid))]
        self.peak_mb = max(self.peak_mb, sum(proportional_bytes(pid) for pid in pids) / 2**20)
        cpu = cpu_s_of(self._pid) + sum(cpu_s_of(pid) for pid in pids[1:])
        self.cpu_s = max(self.cpu_s, cpu)

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()


def pipeline_row(name: str, module: str, site: ScriptSite, pages: int, concurrency: int, tmp: Path) -> Row:
    tag = f"rb{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env(
        {"CRAWL_NAMESPACE": tag, "REDIS_PREFIX": tag, "PG_SCHEMA": tag, "FETCH_ALLOWLIST": f"{SITE_HOST}/32"}
    )
    routing = tmp / "routing.toml"
    routing.write_text('[[rule]]\nrender = "always"\n', encoding="utf-8")
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": tag,
        "REDIS_PREFIX": tag,
        "PG_SCHEMA": tag,
        "FETCH_ALLOWLIST": f"{SITE_HOST}/32",
        "RATE_LIMIT_RPS": "1000",
        "RENDER_CONCURRENCY": str(concurrency),
        "FETCH_CONCURRENCY": str(concurrency),
        "LOG_LEVEL": "WARNING",
        **({"ROUTING_FILE": str(routing)} if module == "renderer" else {}),
    }
    db.ensure_schema(settings)
    logs = (tmp / f"{name}.log").open("w")
    service = subprocess.Popen([sys.executable, "-m", module], env=env, stdout=logs, stderr=logs)
    dlq = subprocess.Popen([sys.executable, "-m", "dlq_consumer"], env=env, stdout=logs, stderr=logs)
    sampler = TreeSampler(service.pid)
    try:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "producer", "--run-id", "bench", "--sitemap", site.url("/sitemap.xml")],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        while account(settings, "bench").accounted < pages:
            if service.poll() is not None:
                raise RuntimeError(f"{module} exited: see {tmp / f'{name}.log'}")
            time.sleep(0.2)
        elapsed_s = time.monotonic() - started
        sampler.stop()
        return Row(name, pages, elapsed_s, sampler.cpu_s, sampler.peak_mb)
    finally:
        for process in (service, dlq):
            process.terminate()
            process.wait(timeout=60)
        logs.close()
        remove_pipeline(settings)


def scrapy_playwright_row(site: ScriptSite, pages: int, concurrency: int, tmp: Path) -> Row:
    urls = tmp / "urls.txt"
    urls.write_text("".join(f"{site.url(f'/p/{n}')}\n" for n in range(pages)), encoding="utf-8")
    chromium = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    argv = [sys.executable, "-m", "bench.scrapy_playwright_run", "--urls", str(urls), "--chromium", chromium]
    argv += ["--concurrency", str(concurrency), "--out", str(tmp / "scrapy_playwright.jsonl")]
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=(tmp / "scrapy.log").open("w"))
    sampler = TreeSampler(process.pid)
    # Sampled until its last moment: its CPU is read from /proc while the browser still runs.
    while process.poll() is None:
        time.sleep(SAMPLE_S)
    sampler.stop()
    elapsed_s = time.monotonic() - started
    stored = sum(1 for _ in (tmp / "scrapy_playwright.jsonl").open(encoding="utf-8"))
    return Row("scrapy-playwright", stored, elapsed_s, sampler.cpu_s, sampler.peak_mb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.render_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    canary = Canary()
    site = ScriptSite(canary, tuple(f"/p/{n}" for n in range(args.pages)))
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            rows.append(pipeline_row("renderer", "renderer", site, args.pages, args.concurrency, tmp))
            rows.append(scrapy_playwright_row(site, args.pages, args.concurrency, tmp))
            rows.append(pipeline_row("worker (no render)", "worker", site, args.pages, args.concurrency, tmp))
    finally:
        site.close()
        canary.close()
    print(f"script-built pages: {args.pages}, {args.concurrency} in flight")
    for row in rows:
        print(row.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
