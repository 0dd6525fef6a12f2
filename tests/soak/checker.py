"""The soak's checker: once the nemesis has stopped and the crawl has drained, what must hold.

    accounting   every URL that entered a run is stored, dead or skipped, exactly once
                 (tests/faults/ledger.py's ledger, run by run)
    queues       no message left in any queue, ready or unacked (held or parked in a consumer),
                 the control queue's crawl requests included: the management API of the
                 soak's own node
    warc         every stored page's WARC record is there, whole (python -m ops.warc check)
    figures      the dashboard's (/api/v1/runs/<run>) and ops.status's (--json --run) pages,
                 dead letters by reason and skips by reason equal SQL's own count
    memory       each process alive through the whole second half grew less than 10 % in RSS
                 over it (sampled from /proc by the soak)

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


def memory(
    samples: Sequence[tuple[float, dict[str, tuple[int, int]]]], mid_s: float, born_by_s: float
) -> Verdict:
    """`samples`: (seconds into the soak, {process name: (pid, RSS kB)}). A process is
    long-lived when the same pid is in a sample taken by `born_by_s` (it has had a quarter of
    the soak to warm up: its first seeding, its first rendered page) and in the last one; its
    growth is from the first sample at or after `mid_s` to the last."""
    verdict = Verdict("memory")
    early = {pid for t, found in samples if t <= born_by_s for pid, _rss in found.values()}
    after = [s for s in samples if s[0] >= mid_s]
    if len(after) < 2:
        verdict.problems.append(f"fewer than 2 RSS samples after {mid_s:.0f} s")
        return verdict
    (_t0, first), (_t1, last) = after[0], after[-1]
    growth: dict[str, float] = {}
    for name, (pid, rss) in first.items():
        if name in last and last[name][0] == pid and pid in early and rss > 0:
            growth[name] = last[name][1] / rss - 1
    verdict.figures = {
        "processes": len(growth),
        "largest_growth_pct": round(100 * max(growth.values(), default=0.0), 1),
        "rss_mb_end": {n: round(last[n][1] / 1024) for n in sorted(growth)},
    }
    if not growth:
        verdict.problems.append("no process lived through the whole second half")
    for name, grew in sorted(growth.items()):
        if grew >= RSS_GROWTH_LIMIT:
            verdict.problems.append(
                f"{name}: RSS {first[name][1] // 1024} MB -> {last[name][1] // 1024} MB (+{100 * grew:.0f} %)"
            )
    return verdict
