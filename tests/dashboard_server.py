"""The dashboard served by a real uvicorn on a free loopback port, from a daemon thread: an
endless SSE stream blocks Starlette's TestClient, so streams are tested against a real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette

from ops.dashboard.app import build_app
from ops.dashboard.config import DashboardSettings
from ops.dashboard.context import Dashboard
from shared.settings import Settings
from tests.ports import free_port

START_TIMEOUT_S = 10


class Served:
    def __init__(self, app: Starlette, port: int) -> None:
        self.app = app
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    @property
    def dashboard(self) -> Dashboard:
        dashboard: Dashboard = self.app.state.dashboard
        return dashboard


@contextmanager
def served(settings: Settings, **dash: object) -> Iterator[Served]:
    port = free_port()
    app = build_app(settings, DashboardSettings(port=port, **dash))  # type: ignore[arg-type]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.02)
    try:
        yield Served(app, port)
    finally:
        server.should_exit = True
        thread.join(timeout=5)
