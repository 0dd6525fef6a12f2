"""The dashboard in a real browser: Playwright for Python (pytest-playwright's fixtures) driving
the system's chromium, never a browser Playwright downloads. One small crawl of the demo site,
in a namespace of its own, with a worker and a dead-letter consumer kept running for the session,
and the dashboard served by uvicorn from a thread. Screenshots go to var/test-artifacts/."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from demo_site.config import SiteConfig
from demo_site.server import DemoSite
from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord
from ops.accounting import account
from shared.messages import CrawlTask
from shared.postgres import db
from shared.settings import Settings
from tests.conftest import cleanup, unique_name
from tests.dashboard_server import Served, served
from tests.e2e.conftest import service_env

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "var" / "test-artifacts"
CHROMIUM = os.environ.get("DASHBOARD_TEST_CHROMIUM", "/usr/bin/chromium")
RATE_LIMIT_RPS = "2"  # per domain: a run of the slow site lasts long enough to watch it move
HOSTILE_RUN = "hostile-run"
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install -y --no-install-recommends chromium")
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": ["--disable-dev-shm-usage"]}


@dataclass
class Crawl:
    settings: Settings
    env: dict[str, str]
    run_id: str
    enqueued: int
    logs: Path
    files: contextlib.ExitStack  # the services' log files, open for the session

    def produce(self, site: DemoSite, run_id: str) -> subprocess.Popen[bytes]:
        log = self.files.enter_context((self.logs / f"producer-{run_id}.log").open("wb"))
        command = [
            sys.executable,
            "-m",
            "producer",
            "--run-id",
            run_id,
            "--sitemap",
            site.config.sitemap_index_url,
        ]
        return subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=log)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)


@pytest.fixture(scope="session")
def crawl() -> Iterator[Crawl]:
    """A finished run of the demo site (pages that answer 500 and 404 among them), the services
    still running for the tests' later runs, and a hostile dead letter in a run of its own."""
    name = unique_name("b")
    settings = Settings.from_env(
        {
            "CRAWL_NAMESPACE": name,
            "REDIS_PREFIX": name,
            "PG_SCHEMA": name,
            "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/crawler_test",
            "RETRY_DELAYS_S": "0.3,0.6",
            "FETCH_ALLOWLIST": "127.0.0.0/8",
        }
    )
    db.ensure_schema(settings)
    logs = ARTIFACTS / "browser-logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = service_env(settings, RATE_LIMIT_RPS=RATE_LIMIT_RPS, LOG_LEVEL="WARNING")
    files = contextlib.ExitStack()
    services = [
        subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=REPO,
            env=env,
            stdout=files.enter_context((logs / f"{module}.log").open("wb")),
            stderr=subprocess.STDOUT,
        )
        for module in ("worker", "dlq_consumer")
    ]
    made = Crawl(settings, env, "browser-run", 0, logs, files)
    try:
        with DemoSite(SiteConfig(port=0, pages_per_host=4, news_per_host=1)) as site:
            producer = made.produce(site, made.run_id)
            assert producer.wait(timeout=120) == 0, "the producer failed: see var/test-artifacts/browser-logs"
            from shared.redis.client import GLANCE, connect_redis
            from shared.redis.keys import Keys
            from shared.redis.runstate import recorded_enqueued

            client = connect_redis(settings, GLANCE)
            made.enqueued = recorded_enqueued(client, Keys(settings.redis_prefix), made.run_id)
            client.close()
            wait_for(lambda: account(settings, made.run_id).accounted >= made.enqueued, 120, "the first run")
            add_hostile_dead_letter(settings)
            yield made
    finally:
        for service in services:
            service.send_signal(signal.SIGTERM)
        for service in services:
            try:
                service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                service.kill()
        files.close()
        cleanup(settings)


def add_dead_letter(conn: Any, crawl: Crawl, url: str, reason: str) -> None:
    body = CrawlTask(url=url, run_id=crawl.run_id, queue="bulk").encode()
    store.upsert(
        conn,
        DeadLetterRecord(
            crawl.run_id,
            url,
            reason,
            "",
            404,
            1,
            0,
            f"{crawl.settings.crawl_namespace}.bulk",
            "w1",
            body,
            None,
            None,
            len(body),
        ),
    )


def add_hostile_dead_letter(settings: Settings) -> None:
    url = f"javascript:alert(3)//{IMG}{SCRIPT}"
    body = CrawlTask(url="https://a.example/x", run_id=HOSTILE_RUN, queue="bulk").encode()
    with db.connect(settings) as conn:
        store.upsert(
            conn,
            DeadLetterRecord(
                HOSTILE_RUN,
                url,
                f"http_500{IMG}",
                f"{SCRIPT}{IMG} <a href=javascript:alert(4)>x</a>",
                500,
                1,
                0,
                f"{settings.crawl_namespace}.bulk",
                f"w{SCRIPT}",
                body,
                None,
                None,
                len(body),
            ),
        )
        conn.commit()


@pytest.fixture(scope="session")
def dashboard(crawl: Crawl) -> Iterator[Served]:
    with served(crawl.settings, refresh_s=0.5) as running:
        yield running


@pytest.fixture(scope="session")
def base_url(dashboard: Served) -> str:
    return dashboard.url


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def copy_for_docs(path: Path, name: str) -> None:
    """With DASHBOARD_DOCS_IMAGES=1, the screenshot is copied where docs/OPERATING.md shows it."""
    if os.environ.get("DASHBOARD_DOCS_IMAGES") == "1":
        shutil.copy(path, REPO / "docs" / "images" / name)
