"""python -m ops.lookup URL [--run ID]: everything the pipeline knows of one URL.

Redis keys are built from fingerprints and domains, so a URL cannot be found with redis-cli
alone: this command canonicalizes the URL as the producer does, derives every key from it
(shared/redis/keys.py) and prints what each holds, with the key's name, so that redis-cli can take it
from there (docs/OPERATING.md, "Inspecting with redis-cli"):

- the fingerprint, and per run its dedup state: claimed (by which producer, alive or not),
  confirmed (published) or handled (a worker settled it);
- its cache entry: age, ETag, Last-Modified, time left;
- its domain: the configured rate and the rate now (its slow-down), the next free slot, a pause,
  requests in flight, and the robots.txt verdict for this URL;
- its page row, dead letter or skip, per run.

Without --run, every run Redis has counters for and every run with a row of the URL is shown.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import IO

import redis

from ops.lookup_rows import ROW_QUERIES, rows_of
from producer.dedup import split_fingerprint
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import InvalidURL, canonicalize, domain_of, fingerprint
from worker.politeness.config import PolitenessConfig
from worker.politeness.ratelimit import rate_fraction
from worker.politeness.robots import RobotsEntry, RobotsRules, product_token

Line = tuple[str, str]  # (what, its value)
MAX_RUNS = 50  # runs shown without --run


def main(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    args = parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "lookup", settings.log_format)
    client = connect_redis(settings, OPERATOR)
    try:
        for what, value in look_up(settings, client, args.url, args.run):
            print(f"{what:<22} {value}" if what else value, file=out)
    finally:
        client.close()
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.lookup", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", metavar="URL", help="the URL, as given or as the producer canonicalized it")
    parser.add_argument("--run", metavar="ID", help="only this run (default: every run found)")
    return parser.parse_args(argv)


def look_up(settings: Settings, client: redis.Redis, url: str, run_id: str | None) -> list[Line]:
    try:
        canonical = canonicalize(url)
    except InvalidURL as exc:
        raise ConfigError(f"{url[:200]!r} is not a URL the pipeline would crawl: {exc.detail}") from None
    keys = Keys(settings.redis_prefix)
    fp = fingerprint(canonical)
    domain = domain_of(canonical)
    rows = rows_of(settings, canonical, run_id)
    runs = [run_id] if run_id else _runs(client, keys, {row_run for _kind, row_run, _line in rows})
    lines: list[Line] = [("url", canonical), ("fingerprint", fp.hex()), ("domain", domain), ("", "")]
    with translate_redis_errors(client):
        now_us = _server_time_us(client)
        for run in runs:
            lines.append((f"dedup [{run}]", _dedup_state(client, keys, run, fp)))
        if not runs:
            lines.append(("dedup", "no run found under this REDIS_PREFIX"))
        lines += _cache(client, keys, fp.hex(), now_us)
        lines += _domain(settings, client, keys, domain, canonical, now_us)
    lines.append(("", ""))
    for kind in ROW_QUERIES:
        found = [(row_run, line) for row_kind, row_run, line in rows if row_kind == kind]
        for row_run, line in found:
            lines.append((f"{kind} [{row_run}]", line))
        if not found:
            lines.append((kind, "none"))
    return lines


def _runs(client: redis.Redis, keys: Keys, with_rows: set[str]) -> list[str]:
    prefix, suffix = keys.run_stats("\0").split("\0")
    with translate_redis_errors(client):
        counted = {
            key.decode()[len(prefix) : -len(suffix)]
            for key in client.scan_iter(keys.run_stats_pattern(), count=1000)
        }
    return sorted(counted | with_rows)[:MAX_RUNS]


def _server_time_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def _dedup_state(client: redis.Redis, keys: Keys, run_id: str, fp: bytes) -> str:
    bucket, field = split_fingerprint(fp)
    key = keys.seen(run_id, bucket)
    state = client.hget(key, field)
    where = f"(HGET {key} <fingerprint bytes 2..10>)"
    if state is None:
        return f"not seen {where}"
    text = state.decode(errors="replace") if isinstance(state, bytes) else str(state)
    if text == "c":
        return f"confirmed: published to the broker {where}"
    if text == "h":
        return f"handled: a worker settled it {where}"
    if text.startswith("o:"):
        owner = text[2:]
        alive = bool(client.exists(keys.producer_heartbeat(run_id, owner)))
        life = "alive" if alive else "gone: the next claim takes it over"
        return f"claimed by producer {owner} ({life}) {where}"
    return f"claimed by an older producer, lease until {text} {where}"


def _cache(client: redis.Redis, keys: Keys, fp_hex: str, now_us: int) -> list[Line]:
    key = keys.cache(fp_hex)
    raw = client.get(key)
    if not isinstance(raw, bytes):
        return [("cache", f"none ({key})")]
    left_s = max(0, int(client.pttl(key))) / 1000
    header_line = raw.partition(b"\n")[0]
    try:
        header = json.loads(header_line)
        age_s = now_us / 1e6 - float(header["at"])
    except (ValueError, KeyError, TypeError):
        return [("cache", f"an entry that does not decode ({key})")]
    return [
        (
            "cache",
            f"status {header.get('status')}, {age_s:.0f} s old, expires in {left_s:.0f} s ({key})",
        ),
        ("cache validators", f"ETag {header.get('etag')!r}, Last-Modified {header.get('lm')!r}"),
    ]


def _domain(
    settings: Settings, client: redis.Redis, keys: Keys, domain: str, url: str, now_us: int
) -> list[Line]:
    rate = PolitenessConfig.from_settings(settings).policy_for(domain).rate_limit_rps
    slowdown = {_text(k): _text(v) for k, v in client.hgetall(keys.backoff(domain)).items()}
    tat = client.get(keys.rate(domain))
    pause_ms = int(client.pttl(keys.pause(domain)))
    inflight = int(client.zcount(keys.inflight(domain), now_us, "+inf"))
    next_slot = max(0.0, (int(tat) - now_us) / 1e6) if tat is not None else 0.0
    if "wmax" in slowdown:
        since_s = now_us / 1e6 - int(slowdown.get("at", "0")) / 1e6
        w0 = float(slowdown["w0"]) if "w0" in slowdown else None
        share = rate_fraction(float(slowdown["wmax"]), since_s, settings.rate_recovery_s, w0)
        why = f", slowed after {slowdown.get('why', '?')} {since_s:.0f} s ago"
    else:
        share, why = 1.0, ""
    lines: list[Line] = [
        ("rate", f"{rate:g}/s configured, now {rate * share:.3g}/s{why} ({keys.backoff(domain)})"),
        ("next slot", f"in {next_slot:.3f} s ({keys.rate(domain)})"),
        ("pause", f"{pause_ms / 1000:.1f} s left ({keys.pause(domain)})" if pause_ms > 0 else "none"),
        ("in flight", f"{inflight} ({keys.inflight(domain)})"),
    ]
    raw = client.get(keys.robots(domain))
    entry = RobotsEntry.decode(raw) if isinstance(raw, bytes) else None
    if entry is None:
        lines.append(("robots", f"not fetched lately ({keys.robots(domain)})"))
    else:
        if entry.verdict == "rules":
            allowed = RobotsRules.from_entry(entry, product_token(settings.user_agent)).allows(url)
            verdict = "allowed" if allowed else "disallowed"
        else:
            verdict = f"{entry.verdict}" + (f" ({entry.detail})" if entry.detail else "")
        left_s = max(0, int(client.pttl(keys.robots(domain)))) / 1000
        lines.append(("robots", f"{verdict}, trusted {left_s:.0f} s more ({keys.robots(domain)})"))
    return lines


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


if __name__ == "__main__":
    run_main("lookup", main)
