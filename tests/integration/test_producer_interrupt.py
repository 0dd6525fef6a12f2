"""Ctrl-C or SIGTERM on `python -m producer`: it settles its batches, prints its summary and exits
with 130 or 143, never 0, and does not wait for a scrape of its metrics."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.faults.site import FaultSite, SiteShape

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_prints_the_summary_of_what_was_published_and_exits_non_zero(
    settings: Settings, signum: int, code: int
) -> None:
    # A metrics port that would make a finished run wait a minute for a scrape: a stopped one does not.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**service_env(settings), "METRICS_PORT": str(port), "METRICS_LINGER_S": "60"}
    # 20 child sitemaps, each answered after 0.5 s: the producer is still reading when stopped.
    with FaultSite(SiteShape(pages=400, urls_per_sitemap=20, sitemap_delay_s=0.5)) as site:
        producer = subprocess.Popen(
            [sys.executable, "-m", "producer", "--run-id", "interrupted", "--sitemap", site.sitemap_index],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Stop it once it has read a few sitemaps, however long a loaded machine takes for that.
        give_up = time.monotonic() + 60
        while site.hits("/sitemaps/3.xml") == 0 and time.monotonic() < give_up and producer.poll() is None:
            time.sleep(0.05)
        assert producer.poll() is None, "the producer finished before Ctrl-C: nothing to test"
        producer.send_signal(signum)
        stdout, stderr = producer.communicate(timeout=40)
    assert producer.returncode == code, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["stopped_early"] is True
    assert summary["stop_signal"] == signal.Signals(signum).name
    assert "until scraped" not in stderr
    assert 0 < summary["enqueued_total"] < 400
    assert "Traceback" not in stderr
    # Off a terminal, progress comes as plain lines; none is due yet, the log says the rest.
    assert "run interrupted stopped before every input was read" in stderr
