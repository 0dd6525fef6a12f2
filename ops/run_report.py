"""python -m ops.run_report --run ID [--wait SECONDS]: a run's accounting, as `make demo`
prints it, for a run whose services run elsewhere (docker compose, many machines).

The figures the producer recorded (enqueued per queue, each URL once however many producers it
took; duplicates, invalid; claims taken over) and the copies workers received (ops/copies.py)
come from the run's Redis counters; where each URL ended comes from PostgreSQL (ops/accounting.py). Exit 0
when every enqueued URL is stored, dead-lettered or skipped, 1 when not (yet).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import IO

import psycopg

from ops.accounting import Accounting, Tally, account
from ops.copies import Copies
from renderer.figures import RENDER_MS_FIELD, RENDERS_PREFIX
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings

POLL_S = 2.0


def producer_counters(settings: Settings, run_id: str) -> dict[str, int]:
    client = connect_redis(settings, OPERATOR)
    try:
        with translate_redis_errors(settings.redis_url):
            raw: dict[bytes, bytes] = client.hgetall(Keys(settings.redis_prefix).run_stats(run_id))  # type: ignore[assignment]
    finally:
        client.close()
    counters = {}
    for key, value in raw.items():
        text = value.decode("utf-8", "replace")
        if text.lstrip("-").isdigit():
            counters[key.decode("utf-8", "replace")] = int(text)
    return counters


def enqueued_by_queue(counters: dict[str, int]) -> dict[str, int]:
    return {name.partition(".")[2]: n for name, n in counters.items() if name.startswith("enqueued.")}


def render(a: Accounting, counters: dict[str, int]) -> str:
    queues = enqueued_by_queue(counters)
    enqueued = sum(queues.values())
    dead = ", ".join(f"{reason} {n}" for reason, n in a.dead_by_reason.items()) or "none"
    skips = ", ".join(f"{reason} {n}" for reason, n in a.skips_by_reason.items()) or "none"
    mark = "ok" if a.accounted == enqueued else ("waiting" if a.accounted < enqueued else "MISMATCH")
    return (
        f"run {a.run_id}\n"
        f"  enqueued          {enqueued:6d}   {queues}\n"
        f"  duplicates        {counters.get('duplicates', 0):6d}   (not enqueued)\n"
        f"  invalid           {counters.get('invalid', 0):6d}   (not enqueued)\n"
        f"  pages stored      {a.stored:6d}   ({a.stored_after_retry} after retries, "
        f"{a.from_cache} from the cache)\n"
        f"  dead letters      {a.dead:6d}   ({dead})\n"
        f"  skipped           {a.skipped:6d}   ({skips})\n"
        f"  accounted for     {a.accounted:6d} of {enqueued}: {mark}\n"
        f"  retries           {a.retries:6d}"
        + rendered_line(counters)
        + renders_line(counters)
        + "".join(f"\n{line}" for line in Copies.from_counters(counters).lines())
    )


def rendered_line(counters: dict[str, int]) -> str:
    """The URLs sent to the renderers, by reason: a routing rule (`enqueued.render`) or a
    worker that found a script shell (RENDER=auto); nothing when there were none."""
    reasons = {"routing rule": counters.get("enqueued.render", 0)}
    reasons.update(
        (name.partition(".")[2].replace("_", " "), n)
        for name, n in counters.items()
        if name.startswith("sent_to_render.")
    )
    total = sum(reasons.values())
    if not total:
        return ""
    shown = ", ".join(f"{reason} {n}" for reason, n in reasons.items() if n)
    return f"\n  sent to render    {total:6d}   ({shown})"


def renders_line(counters: dict[str, int]) -> str:
    """The renders made for the run (every attempt), by outcome, and their mean time
    (renderer/figures.py); nothing when there were none."""
    outcomes = {
        name.removeprefix(RENDERS_PREFIX).replace("_", " "): n
        for name, n in sorted(counters.items())
        if name.startswith(RENDERS_PREFIX) and n
    }
    total = sum(outcomes.values())
    if not total:
        return ""
    shown = ", ".join(f"{outcome} {n}" for outcome, n in outcomes.items())
    mean_ms = counters.get(RENDER_MS_FIELD, 0) / total
    return f"\n  renders           {total:6d}   ({shown}; {mean_ms:.0f} ms each on average)"


def report(settings: Settings, run_id: str, wait_s: float, out: IO[str]) -> int:
    counters = producer_counters(settings, run_id)
    if not counters:
        raise ConfigError(f"--run {run_id}: no such run in Redis under the prefix {settings.redis_prefix!r}")
    enqueued = sum(enqueued_by_queue(counters).values())
    deadline = time.monotonic() + wait_s
    try:
        with Tally(settings, run_id) as tally:
            while tally.accounted() < enqueued and time.monotonic() < deadline:
                time.sleep(POLL_S)
        accounting = account(settings, run_id)
    except psycopg.errors.UndefinedTable:
        raise ConfigError(
            f"--run {run_id}: no results in the schema {settings.pg_schema!r} yet; has a worker started?"
        ) from None
    print(render(accounting, counters), file=out, flush=True)
    return 0 if accounting.accounted == enqueued else 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.run_report", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, metavar="ID", help="the run id")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for the run to finish",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "run_report", settings.log_format)
    return report(settings, args.run, max(0.0, args.wait), sys.stdout)


if __name__ == "__main__":
    run_main("run_report", main)
