"""Hostile pages on the real pipeline: a worker crawls every attack of tests/e2e/hostile_site.py,
plus generated pages, together with ordinary pages in one run. Every URL ends in exactly one
countable place (stored page, dead letter with its reason, skip), the ordinary pages are stored,
the worker never stalls and its peak resident memory stays at or under 150 MiB."""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ops.accounting import account
from ops.crawl import Processes
from shared.postgres import db
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.e2e.hostile_site import HostileSite

pytestmark = pytest.mark.timeout(180)

MAX_WORKER_RSS_MIB = 150
FETCH_DEADLINE_S = 2.0
NORMAL_PAGES = 20
GENERATED_PAGES = 40
# Where each fixed attack must end: a dead-letter reason, or "stored".
EXPECTED = {
    "/drip-headers.html": "timeout",  # cut at the deadline, retried, dead after the 3rd attempt
    "/drip-body.html": "timeout",
    "/deep.html": "parse_limit",
    "/deep-few-tags.html": "parse_limit",
    "/wide.html": "parse_limit",
    "/links.html": "parse_limit",
    "/links-fewer.html": "parse_limit",
    "/many-attributes.html": "parse_limit",
    "/huge-attribute.html": "parse_limit",  # a tag longer than 1 MiB
    "/big-attribute.html": "stored",
    "/gzip-bomb.html": "too_large",
    "/redirect/0.html": "redirect_loop",
    "/bad-utf8.html": "stored",  # undecodable bytes become U+FFFD
    "/utf7-trap.html": "parse_error",
    "/charset-lie.html": "stored",  # a codec that is no text encoding is ignored
}

# Pieces of markup that parsers find hard, and bytes that are no text, in any order.
_PIECES = st.sampled_from(
    [
        *(b"<", b">", b"</", b"<div>", b"</div>", b"<a href=", b"<a href='//x'>", b"<base href=", b"<!--"),
        *(b"-->", b"<![CDATA[", b"<?xml", b"<!DOCTYPE", b"&amp;", b"&#x110000;", b"&#0;", b"<svg>"),
        *(b"<title>", b"<script>", b"</script>", b"<table><tr><td>", b"<meta charset=utf-16>", b"\x00"),
        *(b"\xff\xfe", b"\xed\xa0\x80", b"'", b'"', b"=", b" ", b"\n", b"javascript:", b"http://[::1"),
    ]
)
_CONTENT_TYPES = st.sampled_from(
    [
        *("text/html", "text/html; charset=utf-8", "text/html; charset=utf-16", "text/html; charset=utf-7"),
        *("text/html; charset=shift_jis", "text/html; charset=x-nonsense", "application/xhtml+xml"),
    ]
)


def generated_pages(count: int) -> list[tuple[str, bytes]]:
    """`count` (Content-Type, body) pairs of random HTML-ish bytes, the same on every run."""
    pages: list[tuple[str, bytes]] = []

    @hypothesis_settings(
        max_examples=count, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(_CONTENT_TYPES, st.lists(_PIECES | st.binary(max_size=16), max_size=300).map(b"".join))
    def collect(content_type: str, body: bytes) -> None:
        pages.append((content_type, body))

    collect()
    return pages[:count]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def outcomes(settings: Settings, run_id: str) -> dict[str, list[str]]:
    """URL -> every place it ended: 'stored', 'dead:<reason>' or 'skip:<reason>'."""
    found: dict[str, list[str]] = collections.defaultdict(list)
    with db.connect(settings, autocommit=True) as conn:
        for (url,) in conn.execute("SELECT url FROM pages WHERE run_id = %s", (run_id,)):
            found[str(url)].append("stored")
        dead = "SELECT url, reason FROM dead_letters WHERE run_id = %s AND state = 'dead'"
        for url, reason in conn.execute(dead, (run_id,)):
            found[str(url)].append(f"dead:{reason}")
        for url, reason in conn.execute("SELECT url, reason FROM skips WHERE run_id = %s", (run_id,)):
            found[str(url)].append(f"skip:{reason}")
    return found


@dataclass(frozen=True)
class HostileRun:
    urls: dict[str, list[str]]  # normal, attacks and generated URLs, by kind
    ended: dict[str, list[str]]  # URL -> every place it ended
    site_root: str
    elapsed_s: float
    peak_rss_mib: float  # of the worker
    exit_codes: dict[str, int | None]


def crawl_hostile_site(
    settings: Settings,
    tmp_path: Path,
    attacks: list[str],
    generated: int,
    run_id: str = "e2e-hostile",
    **env_overrides: str,
) -> HostileRun:
    """Crawl the attacks (paths of the hostile site), `generated` generated pages and the
    ordinary pages with one worker; return where each URL ended."""
    with HostileSite(generated_pages(generated) if generated else []) as site:
        kinds = {
            "normal": [site.url(f"/normal/{n}.html") for n in range(NORMAL_PAGES)],
            "attacks": [site.url(path) for path in attacks],
            "generated": [site.url(f"/generated/{n}.html") for n in range(len(site.generated))],
        }
        normal = kinds["normal"]
        # Ordinary pages first and last, so that some are fetched while the attacks are in flight.
        urls = (
            normal[: NORMAL_PAGES // 2] + kinds["attacks"] + kinds["generated"] + normal[NORMAL_PAGES // 2 :]
        )
        (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")

        env = service_env(
            settings,
            FETCH_DEADLINE_S=str(FETCH_DEADLINE_S),
            FETCH_READ_TIMEOUT_S="30",  # far longer than the deadline: only the deadline cuts a drip
            MAX_BODY_BYTES="20000000",  # the page of a million links (17.9 MB) gets through to the parser
            RATE_LIMIT_RPS="100",
            MAX_REDIRECTS="5",
            **env_overrides,
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        procs = Processes(logs, env)
        worker = procs.start("worker", "worker")
        procs.start("dlq_consumer", "dlq_consumer", "consume")
        started = time.monotonic()
        try:
            producer = subprocess.run(
                [sys.executable, "-m", "producer", "--run-id", run_id, "--urls", str(tmp_path / "urls.txt")],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            assert producer.returncode == 0, producer.stderr
            while account(settings, run_id).accounted < len(urls):
                assert time.monotonic() - started < 90, f"stalled: {account(settings, run_id)}"
                procs.check_alive()
                time.sleep(0.25)
            elapsed_s = time.monotonic() - started
            peak_mib = peak_rss_mib(worker.pid)
        finally:
            codes = procs.stop_all()
        return HostileRun(kinds, outcomes(settings, run_id), site.root, elapsed_s, peak_mib, codes)


def test_hostile_pages_each_end_in_one_place_and_the_worker_keeps_going(
    settings: Settings, tmp_path: Path
) -> None:
    run = crawl_hostile_site(settings, tmp_path, list(EXPECTED), GENERATED_PAGES)
    normal, generated = run.urls["normal"], run.urls["generated"]
    assert set(run.ended) == {url for urls in run.urls.values() for url in urls}
    assert {url: places for url, places in run.ended.items() if len(places) != 1} == {}  # exactly one place
    ended = {url: places[0] for url, places in run.ended.items()}
    assert {url: ended[url] for url in normal} == dict.fromkeys(normal, "stored")
    assert {path: ended[run.site_root + path].removeprefix("dead:") for path in EXPECTED} == EXPECTED
    generated_ends = collections.Counter(ended[url] for url in generated)
    assert set(generated_ends) <= {"stored", "dead:parse_error", "dead:parse_limit"}, generated_ends
    assert set(run.exit_codes.values()) == {0}, run.exit_codes  # the worker stopped cleanly
    by_case = "\n".join(f"  {path:24s} {ended[run.site_root + path]}" for path in EXPECTED)
    print(
        f"\nhostile pages: {len(ended)} URLs ({len(normal)} normal, {len(EXPECTED)} attacks, "
        f"{len(generated)} generated) accounted for in {run.elapsed_s:.1f} s; "
        f"worker peak RSS {run.peak_rss_mib:.0f} MiB\n{by_case}\n  generated: {dict(generated_ends)}\n"
        f"  everything: {dict(collections.Counter(ended.values()))}"
    )
    assert run.peak_rss_mib <= MAX_WORKER_RSS_MIB
