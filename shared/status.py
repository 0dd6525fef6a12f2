"""python -m shared.status [--run ID] [--json | --watch [--interval S]]: what the pipeline holds
right now, and what it has been doing in the last minute or two.

Queue depths come from the RabbitMQ management API, which also knows unacked counts; its numbers
are refreshed every few seconds, not live. Without the management plugin a passive declare gives
live ready and consumer counts but no unacked count. Run figures and recent activity (see
shared/activity.py) come from PostgreSQL, counters from the run's Redis hash. Nothing here writes
anything. --watch redraws the view every few seconds until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit

import psycopg
import redis
import requests

from shared import broker, db
from shared.accounting import account
from shared.activity import recent_activity, render_activity
from shared.cli import configure_logging, run_main
from shared.errors import ServiceUnavailable
from shared.keys import Keys
from shared.settings import Settings, redact
from shared.topology import build_topology, dead_letter_queue

MANAGEMENT_TIMEOUT_S = (1.0, 3.0)  # connect, read: status must answer fast even if the API hangs
REDIS_TIMEOUT_S = 3.0
RECENT_RUNS = 10
WATCH_INTERVAL_S = 2.0
STOP_CHECK_S = 0.1  # how soon a watch notices Ctrl-C between redraws
CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase display: redraw in place

REPLAYED_OF_RUN = "SELECT count(*) FROM dead_letters WHERE run_id = %s AND state = 'replayed'"
LATEST_RUNS = """
WITH activity AS (
    SELECT run_id, count(*) AS pages, 0 AS dead, 0 AS skips, max(fetched_at) AS last_at
    FROM pages GROUP BY run_id
    UNION ALL
    SELECT run_id, 0, count(*) FILTER (WHERE state = 'dead'), 0, max(last_failed_at)
    FROM dead_letters GROUP BY run_id
    UNION ALL
    SELECT run_id, 0, 0, count(*), max(recorded_at) FROM skips GROUP BY run_id
)
SELECT run_id, sum(pages)::int, sum(dead)::int, sum(skips)::int, max(last_at)
FROM activity GROUP BY run_id ORDER BY max(last_at) DESC LIMIT %s
"""
TABLES_EXIST = """SELECT to_regclass('pages') IS NOT NULL AND to_regclass('dead_letters') IS NOT NULL
AND to_regclass('skips') IS NOT NULL"""


@dataclass(frozen=True)
class QueueStatus:
    name: str
    role: str  # work | delay | dead
    exists: bool
    ready: int | None  # None: not known (yet) to the source asked
    unacked: int | None
    consumers: int | None


HttpGet = Callable[[str], Any]  # URL → decoded JSON, or raises requests.RequestException


def queue_roles(settings: Settings) -> list[tuple[str, str]]:
    topology = build_topology(settings)
    work = set(topology.work_queues())
    dead = dead_letter_queue(settings.crawl_namespace)
    return [
        (q.name, "work" if q.name in work else "dead" if q.name == dead else "delay") for q in topology.queues
    ]


def management_queues(settings: Settings, get: HttpGet) -> list[QueueStatus] | None:
    """Queue figures from the management API; None if it cannot be asked."""
    vhost = _amqp_part(settings, "vhost")
    url = (
        f"{settings.rabbitmq_management_url.rstrip('/')}/api/queues/{quote(vhost, safe='')}"
        "?columns=name,messages_ready,messages_unacknowledged,consumers"
    )
    try:
        listed = {q["name"]: q for q in get(url) if isinstance(q, dict) and "name" in q}
    except (requests.RequestException, ValueError, TypeError):
        return None
    result = []
    for name, role in queue_roles(settings):
        found = listed.get(name)
        if found is None:
            result.append(QueueStatus(name, role, False, None, None, None))
            continue
        # A queue declared a moment ago has no statistics until the next refresh.
        result.append(
            QueueStatus(
                name,
                role,
                True,
                *(
                    _int_or_none(found.get(k))
                    for k in ("messages_ready", "messages_unacknowledged", "consumers")
                ),
            )
        )
    return result


def amqp_queues(settings: Settings) -> list[QueueStatus]:
    """Queue figures from passive declares: live, but without unacked counts."""
    connection = broker.connect(settings, "status")
    try:
        channel = connection.channel()
        result = []
        for name, role in queue_roles(settings):
            try:
                ready, consumers = broker.queue_depth(channel, name)
            except broker.CONNECTION_ERRORS as exc:
                if not connection.is_open:
                    raise broker.unavailable(settings, exc) from None
                # The broker closes the channel of a passive declare on a missing queue.
                result.append(QueueStatus(name, role, False, None, None, None))
                channel = connection.channel()
                continue
            result.append(QueueStatus(name, role, True, ready, None, consumers))
        return result
    finally:
        if connection.is_open:
            connection.close()


def run_figures(settings: Settings, conn: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    outcome = account(settings, run_id)
    row = conn.execute(REPLAYED_OF_RUN, (run_id,)).fetchone()
    return {
        "pages": outcome.stored,
        "dead_letters": outcome.dead_by_reason,
        "replayed": int(row[0]) if row else 0,
        "skips": outcome.skips_by_reason,
    }


def latest_runs(conn: psycopg.Connection[Any], limit: int = RECENT_RUNS) -> list[dict[str, Any]]:
    rows = conn.execute(LATEST_RUNS, (limit,)).fetchall()
    return [
        {"run_id": r, "pages": p, "dead_letters": d, "skips": s, "last_activity": t.isoformat()}
        for r, p, d, s, t in rows
    ]


def run_counters(settings: Settings, run_id: str) -> dict[str, int | str]:
    client = redis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )
    try:
        raw: dict[bytes, bytes] = client.hgetall(Keys(settings.redis_prefix).run_stats(run_id))  # type: ignore[assignment]
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable("Redis", redact(settings.redis_url), str(exc) or "no answer") from None
    finally:
        client.close()
    counters: dict[str, int | str] = {}
    for key, value in sorted(raw.items()):
        text = value.decode("utf-8", "replace")
        counters[key.decode("utf-8", "replace")] = int(text) if text.lstrip("-").isdigit() else text
    return counters


def gather(settings: Settings, run_id: str | None, get: HttpGet | None = None) -> dict[str, Any]:
    """The whole report as JSON-safe data."""
    queues = management_queues(settings, get or _management_getter(settings))
    source = "management"
    if queues is None:
        queues, source = amqp_queues(settings), "amqp"
    report: dict[str, Any] = {"queue_source": source, "queues": [asdict(q) for q in queues]}
    with db.translate(settings), db.connect(settings, autocommit=True) as conn:
        row = conn.execute(TABLES_EXIST).fetchone()
        has_tables = bool(row and row[0])
        if run_id is None:
            report["runs"] = latest_runs(conn) if has_tables else []
        else:
            empty = {"pages": 0, "dead_letters": {}, "replayed": 0, "skips": {}}
            figures = run_figures(settings, conn, run_id) if has_tables else empty
            report["run"] = {"run_id": run_id, **figures}
        report["activity"] = recent_activity(conn, run_id) if has_tables else None
    if run_id is not None:
        report["run"]["counters"] = run_counters(settings, run_id)
    return report


def render(report: dict[str, Any]) -> str:
    source = "management API" if report["queue_source"] == "management" else "passive declare"
    lines = [f"queues (from the {source})"]
    rows = [("queue", "role", "ready", "unacked", "consumers")]
    for q in report["queues"]:
        figures = [_shown(q[k]) for k in ("ready", "unacked", "consumers")]
        rows.append((q["name"], q["role"], *(figures if q["exists"] else ["missing", "", ""])))
    lines += _table(rows)
    if report.get("activity"):
        lines += ["", *render_activity(report["activity"])]
    if "run" in report:
        run = report["run"]
        lines += ["", f"run {run['run_id']}"]
        lines.append(f"  pages stored   {run['pages']}")
        lines.append(f"  dead letters   {_pairs(run['dead_letters']) or 0}")
        lines.append(f"  replayed       {run['replayed']}")
        lines.append(f"  skips          {_pairs(run['skips']) or 0}")
        lines.append(f"  counters       {_pairs(run['counters']) or '(none)'}")
    else:
        lines += ["", "latest runs"]
        header = ("run", "pages", "dead", "skips", "last activity")
        lines += _table(
            [header]
            + [
                (
                    r["run_id"] or "(no run id)",
                    str(r["pages"]),
                    str(r["dead_letters"]),
                    str(r["skips"]),
                    r["last_activity"],
                )
                for r in report["runs"]
            ]
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.status", description="Queue depths and run figures of the pipeline."
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

    A service that cannot be reached is shown in place of the view and asked again at the next
    redraw, so a watch survives a broker restart.

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
            try:
                view = render(gather(settings, run_id))
            except ServiceUnavailable as exc:
                view = f"error: {exc}"
            stamp = datetime.now().strftime("%H:%M:%S")
            out.write(f"{CLEAR_SCREEN}{view}\n\n{stamp}  every {interval_s:g} s, Ctrl-C to stop\n")
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


def _management_getter(settings: Settings) -> HttpGet:
    auth = (_amqp_part(settings, "user"), _amqp_part(settings, "password"))

    def get(url: str) -> Any:
        response = requests.get(url, auth=auth, timeout=MANAGEMENT_TIMEOUT_S)
        response.raise_for_status()
        return response.json()

    return get


def _amqp_part(settings: Settings, part: str) -> str:
    """User, password or vhost of AMQP_URL, with the AMQP defaults (guest, guest, '/')."""
    url = urlsplit(settings.amqp_url)
    if part == "vhost":
        return unquote(url.path[1:]) if len(url.path) > 1 else "/"
    value = url.username if part == "user" else url.password
    return unquote(value) if value else "guest"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shown(value: int | None) -> str:
    return "?" if value is None else str(value)


def _pairs(counts: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items())


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


if __name__ == "__main__":
    run_main("status", main)
