"""A real worker process is listed by status while it runs, and not a moment after it stops."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

from ops.status import gather
from shared.settings import Settings
from tests.e2e.conftest import service_env

REPO = Path(__file__).resolve().parents[2]


def test_a_worker_stopped_with_sigterm_leaves_the_status_at_once(settings: Settings) -> None:
    quick = dataclasses.replace(settings, rabbitmq_management_url="http://127.0.0.1:1")
    worker = subprocess.Popen(
        [sys.executable, "-m", "worker"],
        cwd=REPO,
        env=service_env(settings, WORKER_ID="presence-1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (workers := gather(quick, None)["workers"]):
            assert worker.poll() is None, worker.communicate()[1]
            assert time.monotonic() < deadline, "the worker never showed up"
            time.sleep(0.2)
        assert [w["worker_id"] for w in workers] == ["presence-1"]
        assert workers[0]["pid"] == worker.pid

        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    finally:
        worker.kill()

    assert worker.returncode == 0, err
    assert gather(quick, None)["workers"] == []
