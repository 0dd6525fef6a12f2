"""The soak's checker: once the nemesis has stopped and the crawl has drained, what must hold.

    accounting   every URL that entered a run is stored, dead or skipped, exactly once
                 (tests/faults/ledger.py's ledger, run by run)
    queues       no message left in any queue, ready or unacked (held or parked in a consumer),
                 the control queue's crawl requests included: the management API of the
                 soak's own node
    warc         every stored page's WARC record is there, whole (python -m ops.warc check)
    figures      the dashboard's (/api/v1/runs/<run>) and ops.status's (--json --run) pages,
                 dead letters by reason and skips by reason equal SQL's own count
    memory       each long-lived process (a life of ten minutes, or three quarters of a shorter
                 soak) grew less than 10 % in RSS over the second half of its life (sampled
                 from /proc by the soak)

Each check returns a Verdict with its figures and, when it fails, what is wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from shared.postgres import db
from shared.settings import Settings
from tests.faults.ledger import Ledger, take_ledger

RSS_GROWTH_LIMIT = 0.10
# A life this long is long-lived: in a 30-minute soak the nemesis kills each role two or three
# times, so most lives are between five and fifteen minutes.
LONG_LIVED_S = 600.0
PAGES = "SELECT count(*) FROM pages WHERE run_id = %s"
DEAD = "SELECT reason, count(*) FROM dead_letters WHERE run_id = %s AND state = 'dead' GROUP BY reason"
SKIPS = "SELECT reason, count(*) FROM skips WHERE run_id = %s GROUP BY reason"


@dataclass
class Verdict:
    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        head = f"{'ok  ' if self.ok else 'FAIL'} {self.name:<11} {json.dumps(self.figures, sort_keys=True)}"
        return [head, *(f"       {p}" for p in self.problems[:20])]


@dataclass(frozen=True)
class Run:
    run_id: str
    urls: tuple[str, ...]  # every URL that entered it


def accounting(settings: Settings, runs: Sequence[Run]) -> tuple[Verdict, dict[str, Ledger]]:
    verdict = Verdict("accounting")
    ledgers = {run.run_id: take_ledger(settings, run.run_id, run.urls) for run in runs}
    totals = {"urls": 0, "stored": 0, "dead": 0, "skipped": 0, "lost": 0, "duplicated": 0, "rewrites": 0}
    for run_id, ledger in ledgers.items():
        totals["urls"] += ledger.published
        totals["stored"] += len(ledger.stored)
        totals["dead"] += len(ledger.dead)
        totals["skipped"] += len(ledger.skipped)
        totals["lost"] += len(ledger.lost)
        totals["duplicated"] += len(ledger.duplicated)
        totals["rewrites"] += ledger.rewrites
        if ledger.lost:
            verdict.problems.append(f"{run_id}: {len(ledger.lost)} lost, e.g. {ledger.lost[:3]}")
        if ledger.duplicated:
            verdict.problems.append(
                f"{run_id}: {len(ledger.duplicated)} with two outcomes, e.g. {ledger.duplicated[:3]}"
            )
    verdict.figures = totals
    return verdict, ledgers


def queues(management_get: Callable[[str], Any], management_url: str) -> Verdict:
    verdict = Verdict("queues")
    listed = management_get(
        f"{management_url}/api/queues?columns=name,messages_ready,messages_unacknowledged"
    )
    left = {
        q["name"]: (int(q.get("messages_ready") or 0), int(q.get("messages_unacknowledged") or 0))
        for q in listed
    }
    verdict.figures = {"queues": len(left), "messages_left": sum(r + u for r, u in left.values())}
    for name, (ready, unacked) in sorted(left.items()):
        if ready or unacked:
            verdict.problems.append(f"{name}: {ready} ready, {unacked} unacked")
    return verdict


def warc(env: Mapping[str, str], warc_dir: str) -> Verdict:
    """One `ops.warc check` of every row: the soak's schema holds its runs alone, and each check
    reads every file whole, so one per run would read the files once a run."""
    verdict = Verdict("warc")
    done = subprocess.run(
        [sys.executable, "-m", "ops.warc", "check", warc_dir],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode != 0:
        verdict.problems.append(f"exit {done.returncode}: {(done.stdout + done.stderr)[-600:]}")
    rows = int(last.split(" rows")[0].split()[-1]) if " rows, " in last else 0
    verdict.figures = {"rows_checked": rows}
    return verdict


def sql_figures(settings: Settings, run_id: str) -> dict[str, Any]:
    with db.connect(settings, autocommit=True) as conn:
        row = conn.execute(PAGES, (run_id,)).fetchone()
        dead = {str(r): int(str(n)) for r, n in conn.execute(DEAD, (run_id,))}
        skips = {str(r): int(str(n)) for r, n in conn.execute(SKIPS, (run_id,))}
    return {"pages": int(str(row[0])) if row else 0, "dead_letters": dead, "skips": skips}


def figures(settings: Settings, env: Mapping[str, str], dashboard_url: str, runs: Sequence[Run]) -> Verdict:
    verdict = Verdict("figures")
    compared = 0
    for run in runs:
        sql = sql_figures(settings, run.run_id)
        done = subprocess.run(
            [sys.executable, "-m", "ops.status", "--json", "--run", run.run_id],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            verdict.problems.append(f"{run.run_id}: ops.status exit {done.returncode}: {done.stderr[-300:]}")
            continue
        status = json.loads(done.stdout)["run"]
        dashboard = requests.get(f"{dashboard_url}/api/v1/runs/{run.run_id}", timeout=60).json()
        for source, shown in (("ops.status", status), ("dashboard", dashboard)):
            for key in ("pages", "dead_letters", "skips"):
                compared += 1
                if shown.get(key) != sql[key]:
                    verdict.problems.append(
                        f"{run.run_id}: {source} {key} {shown.get(key)} != SQL {sql[key]}"
                    )
        # The dashboard's progress figures (stored, dead, skipped) must say the same.
        for key, expected in (
            ("stored", sql["pages"]),
            ("dead", sum(sql["dead_letters"].values())),
            ("skipped", sum(sql["skips"].values())),
        ):
            if key in dashboard:
                compared += 1
                if dashboard[key] != expected:
                    verdict.problems.append(
                        f"{run.run_id}: dashboard {key} {dashboard[key]} != SQL {expected}"
                    )
    verdict.figures = {"figures_compared": compared}
    return verdict


def processes(exited_on_own: Sequence[str], logs_with_tracebacks: Sequence[str]) -> Verdict:
    """A process may end on its own only as designed: a one-line error and a non-zero exit (a
    service that cannot reach PostgreSQL as it starts, say), which a restart policy answers;
    a traceback in any process's log is a failure."""
    verdict = Verdict(
        "processes", {"exited_on_own": len(exited_on_own), "logs_with_tracebacks": len(logs_with_tracebacks)}
    )
    verdict.problems += [f"a traceback in {name}" for name in logs_with_tracebacks]
    return verdict


def memory(samples: Sequence[tuple[float, dict[str, tuple[int, int]]]], soak_s: float) -> Verdict:
    """`samples`: (seconds into the soak, {process name: (pid, RSS kB)}). Each life of a process
    (a name and a pid: the nemesis kills every role in turn, and a restart is a new life) is
    judged when it is long-lived, LONG_LIVED_S or three quarters of a shorter soak, over the
    second half of that life: from its first sample at or after the life's midpoint to its last.
    Shorter lives are still warming up (their first seeding, their first rendered page, the
    allocator's arenas) and would read as growth."""
    verdict = Verdict("memory")
    long_lived_s = min(LONG_LIVED_S, 0.75 * soak_s)
    growth = {
        life: judged for life, rss in _lives(samples).items() if (judged := _second_half(rss, long_lived_s))
    }
    verdict.figures = {
        "long_lived_s": round(long_lived_s),
        "lives_judged": len(growth),
        "largest_growth_pct": round(100 * max((g for _f, _l, g in growth.values()), default=0.0), 1),
        "rss_mb_end": {life: round(last / 1024) for life, (_f, last, _g) in sorted(growth.items())},
    }
    if not growth:
        verdict.problems.append(f"no process lived {long_lived_s:.0f} s to be judged")
    for life, (first, last, grew) in sorted(growth.items()):
        if grew >= RSS_GROWTH_LIMIT:
            verdict.problems.append(
                f"{life}: RSS {first // 1024} MB -> {last // 1024} MB (+{100 * grew:.0f} %)"
            )
    return verdict


def _lives(samples: Sequence[tuple[float, dict[str, tuple[int, int]]]]) -> dict[str, list[tuple[float, int]]]:
    """Each life's (seconds, RSS kB) samples, under "name (pid N)"."""
    lives: dict[str, list[tuple[float, int]]] = {}
    for t, found in samples:
        for name, (pid, rss) in found.items():
            lives.setdefault(f"{name} (pid {pid})", []).append((t, rss))
    return lives


def _second_half(life: list[tuple[float, int]], long_lived_s: float) -> tuple[int, int, float] | None:
    """(RSS at the life's midpoint, at its end, growth) of a long-lived life; None otherwise."""
    born, died = life[0][0], life[-1][0]
    if died - born < long_lived_s:
        return None
    first = next(rss for t, rss in life if t >= (born + died) / 2)
    last = life[-1][1]
    return (first, last, last / first - 1) if first > 0 else None
