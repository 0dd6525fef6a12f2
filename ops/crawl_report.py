"""What `python -m ops.crawl` prints about a run: the producer's line, the accounting at the
end, and what is left after a stop before the end."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from ops.accounting import Accounting
from ops.copies import Copies
from ops.run_watch import WATCH_ERRORS, RunWatch


def producer_line(summary: dict[str, Any]) -> str:
    return (
        f"producer: {summary['urls_seen']} URLs seen, {summary['enqueued_total']} enqueued "
        f"{summary['enqueued']}, {summary['duplicates']} duplicates, "
        f"{sum(summary['invalid'].values())} invalid, "
        f"{len(summary['sitemaps_failed'])} sitemaps failed"
    )


def what_stays(watch: RunWatch, run_id: str) -> str:
    """After a stop before the end: what is left, and how to finish."""
    how = (
        f"Finish the run with: make crawl RUN_ID={run_id} SITEMAP=... (the same inputs), or start "
        f"workers (python -m worker) and the dead-letter consumer"
    )
    try:
        snapshot = watch.snapshot()
    except WATCH_ERRORS as exc:
        return f"  what is left of the run is not known ({exc}). {how}"
    left = max(0, snapshot.total - snapshot.done)
    queued = "?" if snapshot.queued is None else str(snapshot.queued)
    return (
        f"  {left} of the run's {snapshot.total} URLs are not done; the broker keeps them, with "
        f"{queued} messages ready in the work queues (of every run) and any in the delay queues. " + how
    )


def copies_lines(watch: RunWatch) -> list[str]:
    """Claims taken over and the copies the broker got (ops/copies.py); none when Redis
    does not answer, which the rest of the accounting says already."""
    try:
        return Copies.from_counters(watch.counters()).lines()
    except WATCH_ERRORS:
        return []


def print_accounting(
    a: Accounting,
    watch: RunWatch,
    summary: dict[str, Any] | None,
    elapsed_s: float,
    codes: dict[str, int | None],
    log_dir: Path,
    out: IO[str],
    *,
    finished: bool = True,
) -> int:
    """Print the run's accounting; return the total it was checked against (the run's enqueued
    URLs, every producer invocation of the run together). `finished=False`: stopped before the
    end, so URLs not yet accounted for are expected, not a mismatch."""
    expected = watch.total()
    this_time = "" if summary is None else f", {summary['enqueued_total']} of them this time"
    duplicates = "?" if summary is None else f"{summary['duplicates']:6d}"
    dead = ", ".join(f"{reason} {n}" for reason, n in a.dead_by_reason.items()) or "none"
    skips = ", ".join(f"{reason} {n}" for reason, n in a.skips_by_reason.items()) or "none"
    mark = "ok" if a.accounted == expected else "MISMATCH" if finished else "not finished"
    stopped = ", ".join(f"{name}={code}" for name, code in codes.items())
    print(
        f"\nrun {a.run_id}\n"
        f"  enqueued          {expected:6d}   {watch.enqueued_by_queue()}{this_time}\n"
        f"  duplicates        {duplicates:>6}   (not enqueued)\n"
        f"  pages stored      {a.stored:6d}   ({a.stored_after_retry} after retries, "
        f"{a.from_cache} from the cache)\n"
        f"  dead letters      {a.dead:6d}   ({dead})\n"
        f"  skipped           {a.skipped:6d}   ({skips})\n"
        f"  accounted for     {a.accounted:6d} of {expected}: {mark}\n"
        f"  retries           {a.retries:6d}\n"
        f"  cache hits        {a.from_cache:6d}\n"
        + "".join(f"{line}\n" for line in copies_lines(watch))
        + f"  elapsed           {elapsed_s:6.1f} s\n"
        f"  processes stopped with exit codes: {stopped}\n"
        f"  logs in {log_dir}/",
        file=out,
    )
    return expected
