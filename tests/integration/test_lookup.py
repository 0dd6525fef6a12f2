"""python -m ops.lookup against real Redis and PostgreSQL: what it prints of a URL is what the
keys and rows the pipeline's own components wrote hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis

from ops.lookup import look_up
from ops.lookup_rows import rows_of
from producer.dedup import Dedup
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from shared.urls import canonicalize, fingerprint
from tests.e2e.conftest import service_env
from worker.fetch.cache import ResponseCache
from worker.fetch.response import Response
from worker.politeness.ratelimit import RateLimiter
from worker.politeness.robots import RedisRobotsStore, RobotsEntry

URL = "HTTP://Example.COM:80/a/../docs/?b=2&a=1"
DOMAIN = "example.com"
WARC_FILE = "crawl-20260101000000000-00003-w-9.warc.gz"


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    made = connect_redis(settings, OPERATOR)
    yield made
    made.close()


def lines_of(settings: Settings, client: redis.Redis, run: str | None = None) -> dict[str, str]:
    return {what: value for what, value in look_up(settings, client, URL, run) if what}


def test_lookup_shows_what_the_keys_and_rows_hold(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis_prefix)
    canonical = canonicalize(URL)
    fp = fingerprint(canonical)
    # A producer claims the URL in run A and confirms it in run B; run C never saw it.
    Dedup(client, keys, "run-a", owner="p1").claim([fp])
    claimer_b = Dedup(client, keys, "run-b", owner="p2")
    claimer_b.claim([fp])
    claimer_b.confirm([fp])
    for run in ("run-a", "run-b", "run-c"):  # what makes a run known to ops.runs list
        client.hset(keys.run_stats(run), "enqueued.bulk", 1)
    ResponseCache(client, keys, ttl_s=600, max_body_bytes=10_000, enabled=True).put(
        canonical, Response(canonical, 200, "text/html", b"<p>x</p>", etag='"v1"', last_modified="Mon")
    )
    limiter = RateLimiter(client, keys)
    limiter.slow_down(DOMAIN, 2.0)
    limiter.slow_down(DOMAIN, 2.0)
    limiter.pause(DOMAIN, 30)
    paused_at = time.monotonic()  # the figures below age with the machine's speed, not the test's
    RedisRobotsStore(client, keys).put(
        DOMAIN, RobotsEntry("rules", "User-agent: *\nDisallow: /docs/\n").encode(), 120
    )
    db.ensure_schema(settings)
    with db.connect(settings) as conn:
        conn.execute(
            "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id, fetch_ms)"
            " VALUES ('run-b', %s, %s, 200, 'bulk', 'w-9', 42)",
            (canonical, canonical),
        )
        conn.execute(
            "INSERT INTO skips (run_id, url, reason, detail, worker_id)"
            " VALUES ('run-c', %s, 'robots', 'd', 'w-8')",
            (canonical,),
        )
        conn.commit()

    shown = lines_of(settings, client)
    shown_after_s = time.monotonic() - paused_at

    assert shown["url"] == canonical == "http://example.com/docs/?a=1&b=2"
    assert shown["fingerprint"] == fp.hex()
    seen_a = keys.seen("run-a", fp[:2].hex())
    assert client.hget(seen_a, fp[2:]) == b"o:p1"
    assert shown["dedup [run-a]"].startswith("claimed by producer p1 (alive)")
    assert seen_a in shown["dedup [run-a]"]
    assert client.hget(keys.seen("run-b", fp[:2].hex()), fp[2:]) == b"c"
    assert shown["dedup [run-b]"].startswith("confirmed")
    assert shown["dedup [run-c]"].startswith("not seen")

    raw_entry = client.get(keys.cache(fp.hex()))
    assert isinstance(raw_entry, bytes)
    header = json.loads(raw_entry.partition(b"\n")[0])
    assert (header["etag"], header["lm"]) == ('"v1"', "Mon")
    assert shown["cache validators"] == "ETag '\"v1\"', Last-Modified 'Mon'"
    cache_line = re.match(r"status 200, (\d+) s old, expires in (\d+) s ", shown["cache"])
    assert cache_line is not None, shown["cache"]
    cache_age_s, expires_in_s = int(cache_line[1]), int(cache_line[2])
    assert 0 <= cache_age_s <= shown_after_s + 1
    assert 600 - shown_after_s - 1 <= expires_in_s <= 600

    wmax = float(client.hget(keys.backoff(DOMAIN), "wmax"))  # type: ignore[arg-type]
    assert wmax == 1.0  # cut once: the second answer came within the (slowed) interval
    assert re.match(r"2/s configured, now 1\.4\d*/s, slowed after 429 [0-9]+ s ago \(", shown["rate"])
    # What lookup showed is the key's time to live when it read it, to a tenth of a second:
    # between what is left now and 30 s less the time it took to get there.
    pause_s = int(client.pttl(keys.pause(DOMAIN))) / 1000
    shown_pause_s = float(shown["pause"].split(" s left")[0])
    assert pause_s - 0.1 <= shown_pause_s <= 30 and shown_pause_s >= 30 - shown_after_s - 0.1
    assert shown["pause"].endswith(f"({keys.pause(DOMAIN)})")
    assert shown["robots"].startswith("disallowed, trusted 1")
    assert shown["in flight"].startswith("0 ")

    assert re.match(
        r"HTTP 200, bulk, fetched .* by w-9 in 42 ms, 0 failed attempts before$", shown["page [run-b]"]
    )
    assert shown["skip [run-c]"].startswith("robots at ")
    assert shown["dead letter"] == "none"

    only_a = lines_of(settings, client, "run-a")
    assert "dedup [run-b]" not in only_a and only_a["page"] == "none"


def test_lookup_names_the_warc_record_of_a_page_stored_with_warc_on(settings: Settings) -> None:
    canonical = canonicalize(URL)
    db.ensure_schema(settings)
    with db.connect(settings) as conn:
        conn.execute(
            "INSERT INTO pages (run_id, url, final_url, http_status, queue, worker_id, fetch_ms,"
            " warc_filename, warc_offset, warc_length)"
            " VALUES ('run-d', %s, %s, 200, 'bulk', 'w-9', 7, %s, 5120, 17344)",
            (canonical, canonical, WARC_FILE),
        )
        conn.commit()
    ((kind, run, summary),) = [row for row in rows_of(settings, canonical, None) if row[0] == "page"]
    assert (kind, run) == ("page", "run-d")
    assert summary.endswith(
        f" 0 failed attempts before; WARC record in {WARC_FILE} at offset 5120, 17344 bytes"
    )


def test_lookup_of_a_url_nothing_knows(settings: Settings, client: redis.Redis) -> None:
    shown = lines_of(settings, client)
    assert shown["dedup"] == "no run found under this REDIS_PREFIX"
    assert shown["cache"].startswith("none")
    assert shown["pause"] == "none"
    assert shown["robots"].startswith("not fetched lately")
    assert shown["page"] == shown["dead letter"] == shown["skip"] == "none"


def test_the_command_prints_it_and_refuses_a_bad_url_in_one_line(settings: Settings) -> None:
    env = service_env(settings)
    done = subprocess.run(
        [sys.executable, "-m", "ops.lookup", URL, "--run", "r1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "fingerprint" in done.stdout and fingerprint(canonicalize(URL)).hex() in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ops.lookup", "ftp://x"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "lookup: error:" in bad.stderr
