"""python -m bench.polite_floor: the least CPU a polite page can cost on this machine.

One thread does only what a page needs of the services and the site, with nothing of the
pipeline around it: one Redis round trip (its slot), a GET from a loopback site, `parse_page`,
one upsert and commit in PostgreSQL, one ack to RabbitMQ. No other thread, no metrics, no
logging. It does that for pages back to back, then for pages each after a pause (half a
second by default: a polite crawl's pace at 2 pages a second), in alternating rounds, and
prints the CPU a page (`time.thread_time`) of each and their ratio.

Why: `bench.wake_cost` shows that a wake-up after a pause costs little in itself. What costs is
the work after it. A page's steps run through a large body of code (requests, urllib3, lxml,
BeautifulSoup, redis-py, psycopg, pika) that a pause lets the machine push out of the CPU's
caches, so a page done alone runs slower than the same page done right after another. The
ratio this prints is a floor under "a polite page against an unbound one" for any pipeline
that does this work: more code per page, or more threads per page, can only add to it.

The site is `python -m http.server` in a process of its own, so that its CPU and its code are
not in the thread measured. Every name is fresh (a Redis key, a queue, a PostgreSQL schema)
and removed at the end.

    python -m bench.polite_floor                     # 200 pages back to back, 40 after 0.5 s, 2 rounds
    python -m bench.polite_floor --pauses 0.01,0.5 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from psycopg import sql

from bench.measure import free_port_block
from bench.site import page
from bench.wake_cost import pauses_s
from shared.amqp import broker
from shared.errors import ConfigError, ServiceUnavailable
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.settings import Settings
from worker.parse.page import parse_page

SITE_PAGES = 5  # served in turn: a handful, as the response cache would never hold them
SLOT_TTL_MS = 2000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.polite_floor", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pauses", type=pauses_s, default="0.5", help="comma-separated pauses, seconds (default 0.5)"
    )
    parser.add_argument("--hot", type=int, default=200, help="pages back to back a round (default 200)")
    parser.add_argument("--calls", type=int, default=40, help="pages after each pause a round (default 40)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating (default 2)")
    args = parser.parse_args(argv)
    if min(args.hot, args.calls, args.rounds) < 1:
        parser.error("need --hot, --calls and --rounds >= 1")
    return args


@contextmanager
def loopback_site(root: Path) -> Iterator[str]:
    """The pages under `root`, served by a process of their own; the site's origin."""
    for n in range(SITE_PAGES):
        (root / f"p{n}.html").write_bytes(page(f"/p{n}.html").body)
    port = free_port_block(1)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    origin = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                requests.get(f"{origin}/p0.html", timeout=1).raise_for_status()
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise SystemExit("the loopback site did not start within 10 s") from None
                time.sleep(0.1)
        yield origin
    finally:
        server.terminate()
        server.wait(timeout=10)


@dataclass
class PageSteps:
    """The services' side of one page, each step one round trip or none."""

    settings: Settings
    origin: str
    messages: int  # taken from the queue up front, unacked, one acked a page

    def __enter__(self) -> PageSteps:
        """Connect and make the names; what could be left behind by a failure here (the
        schema) is made last. The slot's key expires and the queue is the connection's own."""
        name = self.settings.crawl_namespace
        self.slot_key = f"{name}:slot"
        self.redis = connect_redis(self.settings, OPERATOR, ping=True)  # one line if Redis is not there
        self.http = requests.Session()
        self.connection = broker.connect(self.settings, "bench-polite-floor")
        self.channel = self.connection.channel()
        self.queue = f"{name}.floor"
        self.channel.queue_declare(self.queue, exclusive=True)
        for _ in range(self.messages):
            self.channel.basic_publish("", self.queue, b"a task's worth of bytes".ljust(160))
        self.tags = list(self._take(self.messages))
        self.pages_done = 0
        self.pg = db.connect(self.settings)
        self.schema = sql.Identifier(self.settings.pg_schema)
        self.pg.execute(sql.SQL("CREATE SCHEMA {}").format(self.schema))
        self.pg.execute(
            sql.SQL("CREATE TABLE {}.pages (url text PRIMARY KEY, title text, text text)").format(self.schema)
        )
        self.pg.commit()
        self.upsert = sql.SQL(
            "INSERT INTO {}.pages VALUES (%s, %s, %s) ON CONFLICT (url) DO UPDATE SET text = excluded.text"
        ).format(self.schema)
        return self

    def _take(self, count: int) -> Iterator[int]:
        deadline = time.monotonic() + 30
        while count:
            method, _, _ = self.channel.basic_get(self.queue)
            if method is None:
                if time.monotonic() > deadline:
                    raise SystemExit("the floor's messages did not reach its queue within 30 s")
                time.sleep(0.05)
                continue
            count -= 1
            yield int(method.delivery_tag)

    def __call__(self) -> None:
        n = self.pages_done
        url = f"{self.origin}/p{n % SITE_PAGES}.html"
        self.redis.set(self.slot_key, n, px=SLOT_TTL_MS)
        body = self.http.get(url, timeout=10).content
        parsed = parse_page(body, url)
        self.pg.execute(self.upsert, (f"{url}#{n}", parsed.title, parsed.text))
        self.pg.commit()
        self.channel.basic_ack(self.tags[n])
        self.pages_done += 1

    def __exit__(self, *exc_info: object) -> None:
        self.channel.queue_delete(self.queue)
        self.connection.close()
        self.pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(self.schema))
        self.pg.commit()
        self.pg.close()
        self.redis.delete(self.slot_key)
        self.redis.close()
        self.http.close()


def cpu_us_a_page(steps: PageSteps, pages: int, pause_s: float) -> float:
    """The median CPU a page of this thread, each page after `pause_s`."""
    spent = []
    for _ in range(pages):
        if pause_s:
            time.sleep(pause_s)
        started = time.thread_time_ns()
        steps()
        spent.append(time.thread_time_ns() - started)
    return statistics.median(spent) / 1000


def measure(steps: PageSteps, args: argparse.Namespace, warm: int) -> None:
    cpu_us_a_page(steps, warm, 0.0)  # connections, caches, lazy imports
    print(" | ".join(["round", "back to back", *(f"after {p * 1000:g} ms" for p in args.pauses)]))
    for round_no in range(1, args.rounds + 1):
        hot = cpu_us_a_page(steps, args.hot, 0.0)
        cold = [cpu_us_a_page(steps, args.calls, pause) for pause in args.pauses]
        cells = [f"{hot:.0f} us", *(f"{c:.0f} us ({c / hot:.2f}x)" for c in cold)]
        print(" | ".join([str(round_no), *cells]), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = f"floor{secrets.token_hex(4)}"
    warm = 20
    messages = warm + args.rounds * (args.hot + args.calls * len(args.pauses))
    try:
        settings = Settings.from_env({**os.environ, "CRAWL_NAMESPACE": name, "PG_SCHEMA": name})
        with (
            tempfile.TemporaryDirectory() as root,
            loopback_site(Path(root)) as origin,
            PageSteps(settings, origin, messages) as steps,
        ):
            measure(steps, args, warm)
    except (ConfigError, ServiceUnavailable) as exc:  # a setting or a service: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("median CPU a page of the one thread doing it (a Redis round trip, a GET, parse_page,")
    print("an upsert and commit, an ack); a pause is a sleep before each page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
