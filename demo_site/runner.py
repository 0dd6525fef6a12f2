"""The demo site as a child process, for a launcher that runs a whole crawl as separate processes.

This is the one module of the package that speaks the pipeline's error language: a site that
cannot start is reported like any other unavailable service, as one line instead of a traceback.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from shared.errors import ServiceUnavailable

ANNOUNCEMENT = "demo site: sitemap index at "
REQUEST_LOG_NAME = "site-requests.jsonl"
SITE_LOG_NAME = "demo-site.log"
STOP_TIMEOUT_S = 10.0


@contextlib.contextmanager
def serve_demo_site(log_dir: Path, env: Mapping[str, str], *args: str) -> Iterator[str]:
    """Run `python -m demo_site *args` with `env`; yield the first host's root URL.

    Requests are logged to `log_dir/site-requests.jsonl`, the site's own output to
    `log_dir/demo-site.log`. The site is stopped with SIGTERM on leaving the block.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "demo_site", "--log", str(log_dir / REQUEST_LOG_NAME), *args]
    with (log_dir / SITE_LOG_NAME).open("w", encoding="utf-8") as site_log:
        process = subprocess.Popen(command, env=dict(env), stdout=subprocess.PIPE, stderr=site_log, text=True)
        try:
            yield _root_url(process, log_dir / SITE_LOG_NAME)
        finally:
            _stop(process)


def _root_url(process: subprocess.Popen[str], site_log: Path) -> str:
    """Wait for the site's announcement line; it comes once every address is listening."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(ANNOUNCEMENT):
        process.wait(timeout=STOP_TIMEOUT_S)
        lines = site_log.read_text(encoding="utf-8").strip().splitlines()
        detail = lines[-1] if lines else f"exited with code {process.returncode}"
        raise ServiceUnavailable("demo site", "python -m demo_site", detail, f"see {site_log}")
    index_url = line[len(ANNOUNCEMENT) :].strip()
    return index_url.rsplit("/", 1)[0] + "/"


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()
