"""Fixtures of the renderer's tests: a script-built site, a canary, a running engine, and the
pipeline's services as processes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from bench.script_site import SITE_HOST, Canary, ScriptSite
from renderer.engine import RenderEngine
from renderer.watchdog import Watchdog
from shared.http.netguard import AddressGuard, address_policy
from shared.settings import Settings


@pytest.fixture
def canary() -> Iterator[Canary]:
    listener = Canary()
    yield listener
    listener.close()


@pytest.fixture
def script_site(canary: Canary) -> Iterator[ScriptSite]:
    site = ScriptSite(canary, ("/content", "/links", "/unsettled", "/popup", "/memory", "/away"))
    yield site
    site.close()


def render_settings(**changes: object) -> Settings:
    """Only the site's address is allowed: the canary's, loopback too, stays refused."""
    base = Settings.from_env({"FETCH_ALLOWLIST": f"{SITE_HOST}/32", "RENDER_DEADLINE_S": "6"})
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def engine() -> Iterator[RenderEngine]:
    settings = render_settings()
    watchdog = Watchdog.start()
    started = RenderEngine(settings, AddressGuard(address_policy(settings)), watchdog).start()
    yield started
    started.close()
    watchdog.stop()


class RunningServices:
    """The pipeline's services for one test, each `python -m <module>` with its output in one
    log; stopped (terminated, then waited for) when the block ends, however it ends."""

    def __init__(self, env: dict[str, str], log: Path, *modules: str) -> None:
        self.env = env
        self.log = log
        self.modules = modules
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._out: IO[str] | None = None

    def __enter__(self) -> RunningServices:
        self._out = self.log.open("w")
        for module in self.modules:
            self.processes[module] = subprocess.Popen(
                [sys.executable, "-m", module], env=self.env, stdout=self._out, stderr=self._out
            )
        return self

    def __exit__(self, *_: object) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            process.wait(timeout=30)
        if self._out is not None:
            self._out.close()

    def seed(self, run_id: str, sitemap_url: str) -> subprocess.CompletedProcess[str]:
        """The producer, run to its end over one sitemap: its summary is on stdout."""
        return subprocess.run(
            [sys.executable, "-m", "producer", "--run-id", run_id, "--sitemap", sitemap_url],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )

    def all_alive(self) -> bool:
        return all(process.poll() is None for process in self.processes.values())

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")
