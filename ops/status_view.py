"""The status report (ops/status.py) as text: in full for a one-off look, or fitted to a
terminal for `--watch`, where a view taller or wider than the screen scrolls away between
redraws. Fitted, the retry and defer queues are summed into a line per role, the workers share
one line, and lists that do not fit end with "… N more"; every line is cut to the width."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ops.copies import Copies
from ops.status_politeness import politeness_lines

CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, erase display: redraw in place
SUMMED_ROLES = ("retry", "defer")  # many queues of one role, one line on a screen
ELLIPSIS = "…"

Size = tuple[int, int]  # columns, lines


def render(report: dict[str, Any], size: Size | None = None) -> str:
    """The whole report; with `size`, fitted into that many columns and lines."""
    return "\n".join(view_lines(report, size))


def frame(report: dict[str, Any], footer: str, size: Size) -> str:
    """One redraw of `--watch`: the fitted view, a blank line, the footer. No newline after the
    footer: on the screen's last line it would scroll the top line away."""
    columns, lines = size
    view = view_lines(report, (columns, max(1, lines - 2)))
    return CLEAR_SCREEN + "\n".join([*view, "", clip(footer, columns)])


def view_lines(report: dict[str, Any], size: Size | None) -> list[str]:
    fitted = size is not None
    sections = [_queue_lines(report, fitted)]
    if report.get("activity"):
        sections.append(_activity_lines(report["activity"]))
    sections.append(_worker_lines(report.get("workers"), fitted))
    if politeness := politeness_lines(report):
        sections.append(politeness)
    sections.append(_run_lines(report["run"], fitted) if "run" in report else _runs_lines(report["runs"]))
    if size is None:
        return [line for section in _spaced(sections) for line in section]
    columns, lines = size
    return [clip(line, columns) for line in _fit(_spaced(sections), lines)]


def clip(line: str, columns: int) -> str:
    return line if len(line) <= columns else line[: max(0, columns - 1)] + ELLIPSIS


def _spaced(sections: list[list[str]]) -> list[list[str]]:
    """A blank line before every section but the first."""
    return [sections[0], *(["", *s] for s in sections[1:])]


def _fit(sections: list[list[str]], lines: int) -> list[str]:
    """Cut sections from the last one back until all fit, a cut section ending "… N more";
    each section keeps at least its heading."""
    sections = [list(s) for s in sections]
    for index in range(len(sections) - 1, -1, -1):
        excess = sum(map(len, sections)) - lines
        if excess <= 0:
            break
        section = sections[index]
        keep = max(2 if section and section[0] == "" else 1, len(section) - excess - 1)
        if keep < len(section):
            dropped = len(section) - keep
            sections[index] = [*section[:keep], f"  {ELLIPSIS} {dropped} more"]
    flat = [line for section in sections for line in section]
    return flat[:lines]


def _queue_lines(report: dict[str, Any], fitted: bool) -> list[str]:
    """Fitted, the names lose their namespace (named once, in the heading), which could
    otherwise push the figures off the screen."""
    source = "management API" if report["queue_source"] == "management" else "passive declare"
    queues = report["queues"]
    ns = report.get("namespace", "")
    heading = f"queues (from the {source})"
    if fitted:
        queues = _summed(queues)
        heading = f"queues of {ns} (from the {source})" if ns else heading
    rows = [("queue", "role", "ready", "unacked", "consumers")]
    for q in queues:
        name = q["name"].removeprefix(f"{ns}.") if fitted and ns else q["name"]
        figures = [_shown(q[k]) for k in ("ready", "unacked", "consumers")]
        rows.append((name, q["role"], *(figures if q["exists"] else ["missing", "", ""])))
    return [heading, *_table(rows)]


def _summed(queues: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The retry queues as one row, the defer queues as another."""
    result: list[dict[str, Any]] = []
    for q in queues:
        if q["role"] not in SUMMED_ROLES:
            result.append(q)
            continue
        base = q["name"].rsplit(".", 2)[0]  # <ns>.retry.500ms → <ns>
        name = f"{base}.{q['role']}.*"
        total = next((r for r in result if r["name"] == name), None)
        if total is None:
            total = {
                "name": name,
                "role": q["role"],
                "exists": True,
                "ready": 0,
                "unacked": 0,
                "consumers": 0,
            }
            result.append(total)
        for k in ("ready", "unacked", "consumers"):
            total[k] = None if total[k] is None or q[k] is None else total[k] + q[k]
    return result


def _activity_lines(activity: dict[str, Any]) -> list[str]:
    domains = ", ".join(f"{d['domain']} {d['pages']}" for d in activity["top_domains"])
    return [
        f"activity (last {activity['window_s']} s)",
        f"  pages/s        {activity['pages_per_s']:.2f}  ({activity['pages_in_window']} pages)",
        f"  top domains    {domains or '(none)'}",
        f"  dead letters   {_pairs(activity['dead_letters']) or 0}",
    ]


def _worker_lines(workers: list[dict[str, Any]] | None, fitted: bool) -> list[str]:
    if workers is None:
        return ["workers running: unknown (Redis did not answer)"]
    if not workers:
        return ["workers running: none"]
    # What holds a worker up (a full WARC_DIR): shown whatever the room, it is why pages wait.
    problems = [f"  {w['worker_id']} waits: {w['problem']}" for w in workers if w.get("problem")]
    if fitted:
        listed = ", ".join(f"{w['worker_id']} {w['pages_in_window']}" for w in workers)
        return [f"workers running: {len(workers)} (pages in the window: {listed})", *problems]
    return [
        f"workers running: {len(workers)}",
        *(
            f"  {w['worker_id']}  {w.get('host', '?')} pid {w.get('pid', '?')}, "
            f"{w['pages_in_window']} pages in the window"
            for w in workers
        ),
        *problems,
    ]


def _run_lines(run: dict[str, Any], fitted: bool) -> list[str]:
    prefix = run.get("redis_prefix")
    counters = _pairs(run["counters"]) or "(none)"
    dead = _pairs(run["dead_letters"])
    if fitted:
        return [
            f"run {run['run_id']}" + (f"  (Redis prefix {prefix})" if prefix else ""),
            f"  pages {run['pages']}, dead letters {sum(run['dead_letters'].values())}"
            + (f" ({dead})" if dead else "")
            + f", replayed {run['replayed']}",
            f"  skips     {_pairs(run['skips']) or 0}",
            f"  counters  {counters}",
            *_progress_lines(run, 10),
            *_copies_lines(run, 10),
        ]
    return [
        f"run {run['run_id']}",
        f"  pages stored   {run['pages']}",
        f"  dead letters   {dead or 0}",
        f"  replayed       {run['replayed']}",
        f"  skips          {_pairs(run['skips']) or 0}",
        f"  counters       {counters}" + (f"  (Redis prefix {prefix})" if prefix else ""),
        *_progress_lines(run, 15),
        *_copies_lines(run, 15),
    ]


def _progress_lines(run: dict[str, Any], width: int) -> list[str]:
    """The line ops.crawl prints, from committed figures (ops/run_progress.py)."""
    progress = run.get("progress")
    return [f"  {'progress':<{width}}{progress['line']}"] if progress else []


def _copies_lines(run: dict[str, Any], width: int) -> list[str]:
    """Taken-over claims and the copies the broker got (ops/copies.py)."""
    return Copies.from_counters(run.get("counters", {})).lines(width)


def _runs_lines(runs: list[dict[str, Any]]) -> list[str]:
    header = ("run", "pages", "dead", "skips", "last activity")
    rows = [
        (
            r["run_id"] or "(no run id)",
            str(r["pages"]),
            str(r["dead_letters"]),
            str(r["skips"]),
            r["last_activity"],
        )
        for r in runs
    ]
    return ["latest runs", *_table([header, *rows])]


def _shown(value: int | None) -> str:
    return "?" if value is None else str(value)


def _pairs(counts: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items())


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
