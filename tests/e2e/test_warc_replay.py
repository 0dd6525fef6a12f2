"""A standard replay tool serves a crawled page from the workers' WARC files: pywb, on loopback,
with the run's CDXJ index from `python -m ops.warc cdxj`, gives back the body the site sent,
for a page sent plain, one sent gzip-encoded and one sent chunked.

pywb lives in a virtualenv of its own (`make replay-install`: it pins redis 2.10, which the
pipeline's redis cannot live beside); `make test` and `make e2e` say where, in PYWB_WAYBACK.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from ops.crawl import run_crawl
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.ports import free_port
from tests.warc_site import WarcSite

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def wayback() -> str:
    path = os.environ.get("PYWB_WAYBACK") or str(REPO / ".venv-replay" / "bin" / "wayback")
    assert os.access(path, os.X_OK), f"no pywb at {path}: run `make replay-install` (make test does)"
    return path


def test_pywb_replays_crawled_pages_from_the_warc_files_and_the_run_index(
    settings: Settings, tmp_path: Path
) -> None:
    warc_dir = tmp_path / "warc"
    warc_dir.mkdir()
    with WarcSite(pages=3) as site:
        served = site.served()
        out = io.StringIO()
        env = service_env(settings, WARC_DIR=str(warc_dir))
        code = run_crawl(
            settings, ["--sitemap", site.url("/sitemap.xml")], 1, "replay", env, tmp_path / "logs", 240, out
        )
        assert code == 0, out.getvalue()
    # The site is gone: what pywb serves can only come from the files.
    collection = tmp_path / "pywb" / "collections" / "crawl"
    (collection / "indexes").mkdir(parents=True)
    shutil.copytree(warc_dir, collection / "archive")
    index = subprocess.run(
        [sys.executable, "-m", "ops.warc", "cdxj", str(warc_dir), "--run", "replay",
         "--output", str(collection / "indexes" / "index.cdxj")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert index.returncode == 0, index.stderr
    port = free_port()
    with open(tmp_path / "pywb.log", "wb") as log:
        server = subprocess.Popen(
            [wayback(), "--port", str(port), "--bind", "127.0.0.1"],
            cwd=tmp_path / "pywb",
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            replayed = {url: _replay(port, url, server, tmp_path / "pywb.log") for url in served}
        finally:
            server.terminate()
            server.wait(timeout=30)
    for url, body in served.items():
        assert replayed[url] == body, url


def _replay(port: int, url: str, server: subprocess.Popen[bytes], log: Path) -> bytes:
    """The page as pywb serves it unchanged (`id_`: no rewriting), once pywb answers."""
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, f"pywb exited: {log.read_text(errors='replace')[-2000:]}"
        try:
            answer = requests.get(f"http://127.0.0.1:{port}/crawl/2id_/{url}", timeout=10)
        except requests.ConnectionError:
            assert time.monotonic() < deadline, "pywb did not start listening"
            time.sleep(0.3)
            continue
        assert answer.status_code == 200, f"{url}: {answer.status_code} {answer.text[:300]}"
        return answer.content
