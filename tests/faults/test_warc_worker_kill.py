"""Workers SIGKILLed during a crawl that writes WARC: nothing lost, no file left corrupt (each
killed writer's `.open` file is repaired by the next worker to start), and every stored page's
row names a record that is there, whole, with matching digests."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from shared.settings import Settings
from tests.faults.conftest import SIZE, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import wait_for_ledger, wait_for_progress
from tests.faults.site import FaultSite, SiteShape
from worker.warc.files import whole_length

pytestmark = [pytest.mark.faults, pytest.mark.timeout(SIZE.timeout_s)]

WORKERS = 3
KILL_AT = (0.15, 0.35, 0.55, 0.75)  # shares of the URLs with an outcome when a round of kills comes
KILLED_PER_ROUND = 2


def test_sigkilled_warc_writers_leave_whole_files_and_every_row_its_record(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
    tmp_path: Path,
) -> None:
    warc_dir = tmp_path / "warc"
    warc_dir.mkdir()
    # Small files, so that kills also land on rotations; a page delay keeps fetches in flight.
    environment = env(WARC_DIR=str(warc_dir), WARC_MAX_BYTES="200000")
    web = site(SiteShape(pages=size.urls, page_delay_s=0.02))
    procs = fleet(environment)
    procs.start_services(WORKERS)
    producer = procs.producer("warc-kill", "--sitemap", web.sitemap_index)
    chaos = random.Random(43)
    killed = 0
    for share in KILL_AT:
        wait_for_progress(settings, "warc-kill", int(share * size.urls), size.settle_s, procs.assert_alive)
        for victim in chaos.sample(procs.workers(), KILLED_PER_ROUND):
            procs.kill(victim)
            procs.replace(victim)  # its start repairs the file the killed one left open
            killed += 1
    assert producer.wait(timeout=60) == 0
    ledger = wait_for_ledger(settings, "warc-kill", web.urls(), size.settle_s, check=procs.assert_alive)
    exits = procs.stop()
    assert {e.code for e in exits.values()} == {0}, exits

    ledger.assert_every_url_once()
    assert len(ledger.stored) == size.urls
    names = sorted(os.listdir(warc_dir))
    assert not [n for n in names if n.endswith(".open")], "a clean stop closes every file"
    records = 0
    for name in names:
        with open(warc_dir / name, "rb") as file:
            assert whole_length(file) == os.path.getsize(warc_dir / name), f"{name} is not whole"
        with open(warc_dir / name, "rb") as file:
            for record in ArchiveIterator(file, check_digests=True):
                record.content_stream().read()
                assert record.digest_checker.passed is not False, f"{name}: {record.digest_checker.problems}"
                records += 1
    repaired = procs.log_lines("worker", "repaired WARC file")
    check = subprocess.run(
        [sys.executable, "-m", "ops.warc", "check", str(warc_dir), "--run", "warc-kill"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report(
        **ledger.figures(),
        sigkills=killed,
        warc_files=len(names),
        warc_records=records,
        files_repaired=len(repaired),
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    assert f"{size.urls} rows, 0 problems" in check.stderr
    assert repaired, "no killed writer left a file open: the scenario tested nothing"
