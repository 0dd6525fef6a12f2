"""Read models of the runs and of one run, built on what the CLIs already read: ops.status.gather
(queues, activity, workers, a run's figures and counters), ops.accounting, shared.runstate and
ops.copies. The few queries added here are bounded: LIMITed, over an indexed time window, or
both. Nothing here writes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import redis

from ops.accounting import latest_runs
from ops.copies import Copies
from ops.dashboard.connections import Connections
from ops.dashboard.domains import DOMAINS_LIMIT
from ops.dashboard.panels import politeness_panel, proxies_panel, render_panel, still_growing
from ops.dashboard.text import short_error, whole
from ops.management import HttpGet
from ops.run_progress import ProgressReader, RunProgress
from ops.runs import held_count
from ops.status import gather, run_prefix
from shared.errors import ConfigError
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.redis.runstate import CANCELLED, PAUSED, held_queue, read_state
from shared.settings import Settings

RUNS_LIMIT = 50
STALLED_AFTER_S = 300
# When the run last settled a URL, from the counters the writers keep (no scan of its rows).
LAST_ACTIVITY = "SELECT max(last_at) FROM run_counters WHERE run_id = %s AND kind IN ('page', 'dead', 'skip')"
# The timeline from the buckets the writers' triggers keep (run_timeline, shared/postgres/schema.sql):
# at most one row per 10 s, writer and kind, however many pages the run stores a second, and
# each writer's latest 10 s, which its counter row holds until a later one takes its place.
TIMELINE_BUCKET_S = 10
TIMELINE_KEPT_S = 50 * 60  # the buckets the triggers keep
TIMELINE_KINDS = {"page": "stored", "dead": "dead", "skip": "skipped"}
TIMELINE = """
SELECT kind, date_bin(make_interval(secs => %(step_s)s), bucket, timestamptz 'epoch') AS t, sum(n)::bigint
FROM (SELECT kind, bucket, n FROM run_timeline WHERE run_id = %(run_id)s AND bucket >= %(first)s
      UNION ALL
      SELECT kind, open_bucket, open_n FROM run_counters
      WHERE run_id = %(run_id)s AND open_bucket >= %(first)s) AS buckets
GROUP BY kind, t
"""
# Steps the buckets cannot make (not whole buckets, or older than they are kept), from the rows.
TIMELINE_FROM_ROWS = """
SELECT 'page', date_bin(make_interval(secs => %(step_s)s), fetched_at, timestamptz 'epoch') AS t, count(*)
FROM pages WHERE run_id = %(run_id)s AND fetched_at >= %(first)s GROUP BY t
UNION ALL
SELECT 'dead', date_bin(make_interval(secs => %(step_s)s), last_failed_at, timestamptz 'epoch') AS t, count(*)
FROM dead_letters WHERE run_id = %(run_id)s AND state = 'dead' AND last_failed_at >= %(first)s GROUP BY t
UNION ALL
SELECT 'skip', date_bin(make_interval(secs => %(step_s)s), recorded_at, timestamptz 'epoch') AS t, count(*)
FROM skips WHERE run_id = %(run_id)s AND recorded_at >= %(first)s GROUP BY t
"""
# The step now falls in, and where the first of the steps shown begins.
TIMELINE_NOW = """
SELECT date_bin(make_interval(secs => %(step_s)s), now(), timestamptz 'epoch'),
       date_bin(make_interval(secs => %(step_s)s), now(), timestamptz 'epoch')
       - make_interval(secs => %(step_s)s * %(steps)s)
"""
RECENT_DEAD = """
SELECT last_failed_at, url, reason, http_status, attempts, worker_id, last_error
FROM dead_letters WHERE run_id = %(run_id)s AND state = 'dead' ORDER BY last_failed_at DESC LIMIT %(limit)s
"""
RECENT_SKIPS = """
SELECT recorded_at, url, reason, NULL::int, NULL::int, worker_id, detail
FROM skips WHERE run_id = %(run_id)s AND reason <> 'robots' ORDER BY recorded_at DESC LIMIT %(limit)s
"""
TABLES_EXIST = "SELECT to_regclass('run_counters') IS NOT NULL"


def iso(moment: object) -> str | None:
    return moment.astimezone(dt.UTC).isoformat() if isinstance(moment, dt.datetime) else None


class RunLookup:
    """Finds a run's Redis prefix once (`make demo` keeps its runs under `demo`) and reads its
    state, enqueued count and whether a producer is alive. One client for the whole sample."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self._prefixes: dict[str, str | None] = {}

    def prefix(self, run_id: str) -> str | None:
        if run_id not in self._prefixes:
            with translate_redis_errors(self.settings.redis_url):
                self._prefixes[run_id] = run_prefix(self.client, self.settings, run_id)
        return self._prefixes[run_id]

    def keys(self, run_id: str) -> Keys:
        return Keys(self.prefix(run_id) or self.settings.redis_prefix)

    def redis_runs(self) -> list[str]:
        """Runs with counters under the configured prefix. Not under the well-known ones: those
        hold other namespaces' runs too, and a run of this one shows once it has an outcome."""
        found: list[str] = []
        with translate_redis_errors(self.settings.redis_url):
            for prefix in (self.settings.redis_prefix,):
                head, tail = Keys(prefix).run_stats("\0").split("\0")
                for key in self.client.scan_iter(Keys(prefix).run_stats_pattern(), count=1000):
                    run_id = key.decode()[len(head) : -len(tail)]
                    self._prefixes.setdefault(run_id, prefix)
                    found.append(run_id)
        return found

    def state(self, run_id: str) -> str:
        return read_state(self.client, self.keys(run_id), run_id)


def run_state(state: str, producing: bool, left: int, idle_s: float | None, queued: int | None) -> str:
    """The state shown: paused/cancelled as set; seeding while a producer beats; done when nothing
    is left; stalled when something is left, nothing was stored for a while and the work queues
    are empty; otherwise running."""
    if state in (PAUSED, CANCELLED):
        return state
    if producing:
        return "seeding"
    if left <= 0:
        return "done"
    if idle_s is not None and idle_s > STALLED_AFTER_S and not queued:
        return "stalled"
    return "running"


def progress(run: RunProgress) -> dict[str, Any]:
    """ops.run_progress's figures (the same pages/s and ETA as ops.crawl and ops.status --run),
    and the percentage done."""
    return {
        **run.as_json(),
        "percent": 100 if run.enqueued <= 0 else min(100, round(100 * run.done / run.enqueued)),
    }


def work_queued(queues: list[dict[str, Any]]) -> int | None:
    figures = [q["ready"] for q in queues if q["role"] == "work" and q["exists"]]
    return None if any(f is None for f in figures) else sum(figures)


def runs_page(links: Connections, limit: int = RUNS_LIMIT, before: str | None = None) -> list[dict[str, Any]]:
    """The runs, newest activity first (keyset on the last activity), as GET /api/v1/runs answers."""
    try:
        after = dt.datetime.fromisoformat(before) if before else None
    except ValueError:
        raise ConfigError(f"before {before!r} is not an ISO 8601 time") from None
    settings = links.settings
    with links.db() as conn:
        exists = conn.execute(TABLES_EXIST).fetchone()
        totals = latest_runs(conn, limit, after) if exists and exists[0] else []
        lookup = RunLookup(settings, links.redis)
        known = {t.run_id for t in totals}
        fresh = [r for r in lookup.redis_runs() if r not in known] if after is None else []
        now = dt.datetime.now(dt.UTC)
        with ProgressReader(settings, conn=conn, client=links.redis) as reader:
            rows = [_run_row(lookup, reader, t.run_id, t.last_activity, now) for t in totals]
            rows += [_run_row(lookup, reader, run_id, None, now) for run_id in fresh]  # nothing settled yet
    return rows[:limit]


def _run_row(
    lookup: RunLookup, reader: ProgressReader, run_id: str, last_at: dt.datetime | None, now: dt.datetime
) -> dict[str, Any]:
    figures = progress(reader.read(run_id, lookup.prefix(run_id)))
    idle_s = (now - last_at).total_seconds() if last_at else None
    state = run_state(lookup.state(run_id), figures["producing"], figures["left"], idle_s, None)
    return {**figures, "state": state, "last_activity": iso(last_at), "redis_prefix": lookup.prefix(run_id)}


def run_detail(links: Connections, run_id: str, get: HttpGet | None = None) -> dict[str, Any]:
    """gather()'s run, plus state, enqueued, left (by where it waits), held, copies, and the
    pages/s and ETA of ops.run_progress."""
    settings = links.settings
    with links.db() as conn:
        # The busiest domains for the per-domain table too (domains.py), read once.
        report = gather(settings, run_id, get, conn=conn, client=links.redis, domains_shown=DOMAINS_LIMIT)
        run = report["run"]
        queued = work_queued(report["queues"])
        lookup = RunLookup(settings, links.redis)
        raw_state = lookup.state(run_id)
        with translate_redis_errors(settings.redis_url):
            discovery = bool(links.redis.exists(lookup.keys(run_id).run_discovery(run_id)))
        with ProgressReader(settings, conn=conn, client=links.redis) as reader:
            figures = progress(reader.read(run_id, lookup.prefix(run_id), queued))
        exists = conn.execute(TABLES_EXIST).fetchone()
        row = conn.execute(LAST_ACTIVITY, (run_id,)).fetchone() if exists and exists[0] else None
    last_at = row[0] if row and isinstance(row[0], dt.datetime) else None
    idle_s = (dt.datetime.now(dt.UTC) - last_at).total_seconds() if last_at else None
    held = _held(settings, report, run_id)
    state = run_state(raw_state, figures["producing"], figures["left"], idle_s, queued)
    counts = (figures["enqueued"], figures["stored"], figures["dead"], figures["skipped"], held)
    return {
        **run,
        **figures,
        "state": state,
        "discovery": discovery,
        "growing": still_growing(
            discovery, state, figures["left"], report["queues"], settings.crawl_namespace
        ),
        "held": held,
        "identity": identity(report["queues"], *counts),
        "copies": run.get("copies") or Copies.from_counters({}).figures(),
        "rate": {"pages_per_s": figures["pages_per_s"], "window_s": figures["window_s"]},
        "last_activity": iso(last_at),
        "activity": report["activity"],
        "workers": report["workers"],
        "queues": report["queues"],
        "namespace": report["namespace"],
        "proxies": proxies_panel(report.get("proxies")),
        "politeness": politeness_panel(report.get("politeness")),
        "render": render_panel(
            run.get("counters") or {},
            run.get("dead_letters") or {},
            report["queues"],
            settings.crawl_namespace,
            report["workers"],
        ),
    }


def _held(settings: Settings, report: dict[str, Any], run_id: str) -> int:
    name = held_queue(settings.crawl_namespace, run_id)
    for queue in report["queues"]:
        if queue["name"] == name and queue["ready"] is not None:
            return int(queue["ready"]) + int(queue["unacked"] or 0)
    if report["queue_source"] == "management":
        return 0  # the management API lists every queue: no hold queue, nothing held
    return held_count(settings, run_id)


def identity(
    queues: list[dict[str, Any]], enqueued: int, stored: int, dead: int, skipped: int, held: int
) -> dict[str, Any]:
    """enqueued = stored + dead + skipped + left, with left by where it waits now. Queue figures
    other than the run's hold queue are namespace-wide, shared by every run."""
    where: dict[str, int] = {}
    for queue in queues:
        if queue["role"] in ("work", "retry", "defer", "parked") and queue["exists"]:
            role = queue["role"]
            where[f"{role}_ready"] = where.get(f"{role}_ready", 0) + int(queue["ready"] or 0)
            where[f"{role}_unacked"] = where.get(f"{role}_unacked", 0) + int(queue["unacked"] or 0)
    left = max(0, enqueued - stored - dead - skipped)
    return {
        "enqueued": enqueued,
        "stored": stored,
        "dead": dead,
        "skipped": skipped,
        "left": left,
        "holds": enqueued == stored + dead + skipped + left,
        "accounted": stored + dead + skipped,
        "ok": left == 0 and enqueued > 0,
        "held": held,
        "shared_queues": where,
    }


def from_buckets(minutes: int, step_s: int) -> bool:
    return step_s % TIMELINE_BUCKET_S == 0 and minutes * 60 + step_s <= TIMELINE_KEPT_S


def timeline(links: Connections, run_id: str, minutes: int = 15, step_s: int = 10) -> list[dict[str, Any]]:
    """[{t, stored, dead, skipped}] for every step of the last minutes, oldest first, empty steps
    included, from commit times (so it survives a restart and agrees between replicas). Steps
    are aligned on the clock (every 10 s from the epoch), the last one the step now is in; each
    counts the outcomes whose commit time falls in it, as count(*) over the rows would."""
    counts: dict[str, dict[str, int]] = {}
    steps = minutes * 60 // step_s
    with links.db() as conn, conn.transaction():
        row = conn.execute(TIMELINE_NOW, {"step_s": step_s, "steps": steps}).fetchone()
        assert row is not None
        last, first = row
        params = {"run_id": run_id, "step_s": step_s, "first": first}
        query = TIMELINE if from_buckets(minutes, step_s) else TIMELINE_FROM_ROWS
        for kind, moment, n in conn.execute(query, params):
            counts.setdefault(iso(moment) or "", {})[TIMELINE_KINDS[str(kind)]] = whole(n)
    points = []
    for back in range(steps, -1, -1):
        t = iso(last - dt.timedelta(seconds=back * step_s)) or ""
        found = counts.get(t, {})
        points.append({"t": t, **{k: found.get(k, 0) for k in ("stored", "dead", "skipped")}})
    return points


def recent_errors(links: Connections, run_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """The latest dead letters and skips (robots skips aside), newest first."""
    rows: list[Any] = []
    with links.db() as conn:
        for query in (RECENT_DEAD, RECENT_SKIPS):
            rows += conn.execute(query, {"run_id": run_id, "limit": limit}).fetchall()
    rows.sort(key=lambda r: r[0], reverse=True)
    return [
        {
            "at": iso(at),
            "kind": "skip" if attempts is None else "dead",
            "url": url,
            "reason": reason,
            "http_status": status,
            "attempts": attempts,
            "worker_id": worker,
            "error": short_error(error),
        }
        for at, url, reason, status, attempts, worker, error in rows[:limit]
    ]
