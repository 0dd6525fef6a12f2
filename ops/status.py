"""python -m ops.status [--run ID] [--json | --watch [--interval S]]: what the pipeline holds
right now, and what it has been doing in the last minute.

Queues are the ones that exist: the management API lists the vhost's queues, and those named
as this namespace's (work, retry, defer, dead, parked, held: shared.amqp.topology.queue_role) are shown,
with ready and unacked counts the broker refreshes every few seconds. The work, dead and parked
queues are always shown, as missing when absent. Without the management plugin, passive
declares of the names the settings imply give live ready and consumer counts, no unacked count,
and only the delay queues these settings would declare.

Run figures and recent activity (ops/activity.py) come from PostgreSQL; a run's counters from
its Redis hash, under whichever prefix the run used (the configured one, a well-known one, or
one a scan finds); the running workers from their presence keys (shared/redis/presence.py). Nothing
here writes anything. The text is drawn by ops/status_view.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TextIO

import psycopg
import redis

from ops import management
from ops.accounting import account_on
from ops.accounting import latest_runs as latest_run_totals
from ops.activity import TOP_DOMAINS, recent_activity
from ops.copies import Copies
from ops.management import HttpGet
from ops.run_progress import ProgressReader
from ops.status_politeness import politeness_figures, proxy_health
from ops.status_view import CLEAR_SCREEN, clip, frame, render
from shared.amqp import broker
from shared.amqp.topology import (
    CONTROL,
    DEAD,
    DISCOVERY,
    PARKED,
    build_topology,
    dead_letter_queue,
    delay_queue,
    parked_queue,
    queue_role,
)
from shared.cli import configure_logging, run_main
from shared.errors import ServiceUnavailable
from shared.messages import QUEUE_KINDS
from shared.postgres import db
from shared.redis.client import GLANCE, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.redis.presence import live_workers
from shared.redis.runstate import held_queue
from shared.settings import Settings

__all__ = ["CLEAR_SCREEN", "gather", "main", "render"]

RECENT_RUNS = 10
WATCH_INTERVAL_S = 2.0
STOP_CHECK_S = 0.1  # how soon a watch notices Ctrl-C between redraws
SCREEN_FALLBACK = (80, 24)  # columns, lines when the output is not a terminal
# Where a run's counters are looked for before scanning: the default REDIS_PREFIX and the one
# `make demo` uses (ops/crawl.py), so `--run <demo run>` needs no REDIS_PREFIX.
KNOWN_PREFIXES = ("crawl", "demo")
# Without the management API, retry queues are found by name: those of the settings, of the
# default RETRY_DELAYS_S and of `make demo` (ops/crawl.py), whichever exist.
KNOWN_RETRY_DELAYS_S = (0.5, 1.0, 5.0, 30.0)
ROLE_ORDER = ("work", DISCOVERY, DEAD, PARKED, CONTROL, "retry", "defer", "held")
_DELAY_MS = re.compile(r"\.([0-9]+)ms$")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")

REPLAYED_OF_RUN = "SELECT coalesce(sum(n), 0) FROM run_counters WHERE run_id = %s AND kind = 'replayed'"
TABLES_EXIST = """SELECT to_regclass('pages') IS NOT NULL AND to_regclass('dead_letters') IS NOT NULL
AND to_regclass('skips') IS NOT NULL AND to_regclass('run_counters') IS NOT NULL"""


@dataclass(frozen=True)
class QueueStatus:
    name: str
    role: str  # work | retry | defer | dead | parked
    exists: bool
    ready: int | None  # None: not known (yet) to the source asked
    unacked: int | None
    consumers: int | None


def always_shown(settings: Settings) -> list[str]:
    """The queues every pipeline has: shown as missing when absent, unlike a delay queue."""
    ns = settings.crawl_namespace
    return [*build_topology(settings).work_queues(), dead_letter_queue(ns), parked_queue(ns)]


def management_queues(settings: Settings, get: HttpGet) -> list[QueueStatus] | None:
    """The namespace's queues as the management API lists them; None if it cannot be asked."""
    listed = management.list_queues(settings, get)
    if listed is None:
        return None
    result = []
    for found in listed:
        role = queue_role(settings.crawl_namespace, found["name"])
        if role is None:
            continue
        # A queue declared a moment ago has no statistics until the next refresh.
        figures = [
            _int_or_none(found.get(k)) for k in ("messages_ready", "messages_unacknowledged", "consumers")
        ]
        result.append(QueueStatus(found["name"], role, True, *figures))
    names = {q.name for q in result}
    result += [_missing(settings, name) for name in always_shown(settings) if name not in names]
    return sorted(result, key=_order)


def amqp_queues(settings: Settings, run_id: str | None = None) -> list[QueueStatus]:
    """Queue figures from passive declares of the names the settings imply (and of the usual
    retry queues, and the hold queue of the run asked about): live, but without unacked
    counts, and blind to other delay and hold queues."""
    shown = set(always_shown(settings))
    ns = settings.crawl_namespace
    names = [q.name for q in build_topology(settings).queues]
    usual = [delay_queue(ns, int(seconds * 1000)) for seconds in KNOWN_RETRY_DELAYS_S]
    names += [name for name in usual if name not in names]
    if run_id is not None:
        names.append(held_queue(ns, run_id))
    connection = broker.connect(settings, "status")
    try:
        channel = connection.channel()
        result = []
        for name in names:
            try:
                ready, consumers = broker.queue_depth(channel, name)
            except broker.CONNECTION_ERRORS as exc:
                if not connection.is_open:
                    raise broker.unavailable(settings, exc) from None
                # The broker closes the channel of a passive declare on a missing queue.
                if name in shown:
                    result.append(_missing(settings, name))
                channel = connection.channel()
                continue
            role = queue_role(ns, name) or "work"
            result.append(QueueStatus(name, role, True, ready, None, consumers))
        return sorted(result, key=_order)
    finally:
        if connection.is_open:
            connection.close()


def _missing(settings: Settings, name: str) -> QueueStatus:
    return QueueStatus(name, queue_role(settings.crawl_namespace, name) or "work", False, None, None, None)


def _order(queue: QueueStatus) -> tuple[int, int, str]:
    """Work queues as the topology lists them, then dead, parked, retry and defer by delay,
    then the hold queues by name."""
    delay = _DELAY_MS.search(queue.name)
    kind = queue.name.rsplit(".", 1)[-1]
    within = int(delay.group(1)) if delay else QUEUE_KINDS.index(kind) if kind in QUEUE_KINDS else 0
    return ROLE_ORDER.index(queue.role), within, queue.name


def run_figures(settings: Settings, conn: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    outcome = account_on(conn, run_id)
    row = conn.execute(REPLAYED_OF_RUN, (run_id,)).fetchone()
    return {
        "pages": outcome.stored,
        "dead_letters": outcome.dead_by_reason,
        "replayed": int(row[0]) if row else 0,
        "skips": outcome.skips_by_reason,
    }


def latest_runs(conn: psycopg.Connection[Any], limit: int = RECENT_RUNS) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run.run_id,
            "pages": run.stored,
            "dead_letters": run.dead,
            "skips": run.skipped,
            "last_activity": run.last_activity.isoformat(),
        }
        for run in latest_run_totals(conn, limit)
    ]


def run_prefix(client: redis.Redis, settings: Settings, run_id: str) -> str | None:
    """The Redis prefix the run's counters live under: the configured one, a well-known one,
    or the first a scan finds; None when the run has no counters anywhere."""
    for prefix in dict.fromkeys((settings.redis_prefix, *KNOWN_PREFIXES)):
        if client.exists(Keys(prefix).run_stats(run_id)):
            return prefix
    suffix = f":run:{run_id}:stats"
    for key in client.scan_iter(match="*" + _GLOB_SPECIAL.sub(r"\\\1", suffix), count=1000):
        text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        if text.endswith(suffix):
            return text[: -len(suffix)]
    return None


def run_counters(client: redis.Redis, prefix: str, run_id: str) -> dict[str, int | str]:
    raw: dict[bytes, bytes] = client.hgetall(Keys(prefix).run_stats(run_id))  # type: ignore[assignment]
    counters: dict[str, int | str] = {}
    for key, value in sorted(raw.items()):
        text = value.decode("utf-8", "replace")
        counters[key.decode("utf-8", "replace")] = int(text) if text.lstrip("-").isdigit() else text
    return counters


def running_workers(
    client: redis.Redis, prefixes: Sequence[str], pages: dict[str, int]
) -> list[dict[str, Any]]:
    """Workers with a presence key under any of `prefixes`, with the pages each stored lately."""
    found = {w["worker_id"]: w for prefix in dict.fromkeys(prefixes) for w in live_workers(client, prefix)}
    return [{**w, "pages_in_window": pages.get(worker_id, 0)} for worker_id, w in sorted(found.items())]


def add_redis_figures(
    settings: Settings, report: dict[str, Any], run_id: str | None, lent: redis.Redis | None = None
) -> None:
    """The run's counters and the running workers. Without Redis a run's view fails (its
    counters were asked for); the overview goes on without the workers. A `lent` client is used
    and left open."""
    client = lent if lent is not None else connect_redis(settings, GLANCE)
    activity = report.get("activity")
    pages = activity["pages_by_worker"] if activity else {}
    try:
        with translate_redis_errors(settings.redis_url):
            prefixes = [settings.redis_prefix]
            if run_id is not None:
                prefix = run_prefix(client, settings, run_id)
                report["run"]["redis_prefix"] = prefix
                report["run"]["counters"] = run_counters(client, prefix, run_id) if prefix else {}
                report["run"]["copies"] = Copies.from_counters(report["run"]["counters"]).figures()
                prefixes += [prefix] if prefix else []
            report["workers"] = running_workers(client, prefixes, pages)
            report["proxies"] = proxy_health(settings, client)
            report["politeness"] = politeness_figures(settings, client)
    except ServiceUnavailable:
        if run_id is not None:
            raise
        report["workers"] = None
        report["proxies"] = report["politeness"] = None
    finally:
        if lent is None:
            client.close()


def gather(
    settings: Settings,
    run_id: str | None,
    get: HttpGet | None = None,
    *,
    conn: psycopg.Connection[Any] | None = None,
    client: redis.Redis | None = None,
    domains_shown: int = TOP_DOMAINS,
) -> dict[str, Any]:
    """The whole report as JSON-safe data. Over connections of its own, opened and closed
    here, or over the caller's: a PostgreSQL `conn` in autocommit and a Redis `client`, which
    are used and left open (the dashboard asks every few seconds). `domains_shown`: how many
    of the busiest domains the activity lists."""
    queues = management_queues(settings, get or management.getter(settings))
    source = "management"
    if queues is None:
        queues, source = amqp_queues(settings, run_id), "amqp"
    report: dict[str, Any] = {
        "namespace": settings.crawl_namespace,
        "queue_source": source,
        "queues": [asdict(q) for q in queues],
    }
    with db.translate(settings), contextlib.ExitStack() as opened:
        pg = conn if conn is not None else opened.enter_context(db.connect(settings, autocommit=True))
        row = pg.execute(TABLES_EXIST).fetchone()
        has_tables = bool(row and row[0])
        if run_id is None:
            report["runs"] = latest_runs(pg) if has_tables else []
        else:
            empty = {"pages": 0, "dead_letters": {}, "replayed": 0, "skips": {}}
            figures = run_figures(settings, pg, run_id) if has_tables else empty
            report["run"] = {"run_id": run_id, **figures}
        report["activity"] = recent_activity(pg, run_id, domains_shown) if has_tables else None
    add_redis_figures(settings, report, run_id, client)
    if run_id is not None and has_tables:
        with ProgressReader(settings, conn=conn, client=client) as reader:
            report["run"]["progress"] = progress_figures(reader, report, run_id)
    return report


def progress_figures(reader: ProgressReader, report: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The run's pages/s and ETA as ops.crawl shows them (ops/run_progress.py), with the
    ready messages of the work queues as its "queued"."""
    work = [q["ready"] for q in report["queues"] if q["role"] == "work" and q["exists"]]
    queued = sum(work) if work and None not in work else None
    progress = reader.read(run_id, report["run"].get("redis_prefix"), queued)
    return {**progress.as_json(), "line": progress.line()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.status", description="Queue depths and run figures of the pipeline."
    )
    parser.add_argument("--run", metavar="ID", help="figures of this run (default: list latest runs)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print JSON instead of tables")
    shown.add_argument("--watch", action="store_true", help="redraw the view until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=WATCH_INTERVAL_S,
        metavar="S",
        help=f"seconds between redraws with --watch (default {WATCH_INTERVAL_S:g})",
    )
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "status", settings.log_format)
    if args.watch:
        return watch(settings, args.run, args.interval)
    report = gather(settings, args.run)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def watch(settings: Settings, run_id: str | None, interval_s: float, out: TextIO = sys.stdout) -> int:
    """Redraw the view every `interval_s` until Ctrl-C, which is how it is meant to end: exit 0.

    Each frame is fitted to the terminal (80×24 when the output is not one), and ends without a
    newline, so that nothing scrolls. A service that cannot be reached is shown in place of the
    view and asked again at the next redraw, so a watch survives a broker restart.

    Ctrl-C sets a flag rather than raising KeyboardInterrupt into whatever runs at that moment:
    raised inside one of the client libraries gathering the view, it could be lost there (one
    Ctrl-C in sixty, in a stress run), and the watch went on. A view being gathered is
    finished first; a second Ctrl-C interrupts at once."""
    stopping: list[bool] = []  # not an Event: setting one takes a lock the waiting thread may hold

    def request_stop(_signum: int, _frame: object) -> None:
        stopping.append(True)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, request_stop)
    try:
        while not stopping:
            stamp = datetime.now().strftime("%H:%M:%S")
            footer = f"{stamp}  every {interval_s:g} s, Ctrl-C to stop"
            size = shutil.get_terminal_size(SCREEN_FALLBACK)
            try:
                shown = frame(gather(settings, run_id), footer, (size.columns, size.lines))
            except ServiceUnavailable as exc:
                shown = f"{CLEAR_SCREEN}{clip(f'error: {exc}', size.columns)}\n\n{footer}"
            out.write(shown)
            out.flush()
            deadline = time.monotonic() + interval_s
            while not stopping and (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, STOP_CHECK_S))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    out.write("\n")
    return 0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


if __name__ == "__main__":
    run_main("status", main)
