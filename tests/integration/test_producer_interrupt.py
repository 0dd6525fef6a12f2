"""Ctrl-C on `python -m producer`: it settles its batches, prints its summary and exits with 130."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.faults.site import FaultSite, SiteShape

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_ctrl_c_prints_the_summary_of_what_was_published_and_exits_130(settings: Settings) -> None:
    # 20 child sitemaps, each answered after 0.5 s: the producer is still reading when stopped.
    with FaultSite(SiteShape(pages=400, urls_per_sitemap=20, sitemap_delay_s=0.5)) as site:
        producer = subprocess.Popen(
            [sys.executable, "-m", "producer", "--run-id", "interrupted", "--sitemap", site.sitemap_index],
            env=service_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)
        assert producer.poll() is None, "the producer finished before Ctrl-C: nothing to test"
        producer.send_signal(signal.SIGINT)
        stdout, stderr = producer.communicate(timeout=60)
    assert producer.returncode == 130, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["stopped_early"] is True
    assert 0 < summary["enqueued_total"] < 400
    assert "Traceback" not in stderr
    # Off a terminal, progress comes as plain lines; none is due in 3 s, the log says the rest.
    assert "run interrupted stopped before every input was read" in stderr
