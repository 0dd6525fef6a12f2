"""build_app: the routes, the middleware (outermost first: the session cookie, then the Guard
of security.py), the static files, and the start-up (the audit table, not fatal when the
database is down: the pages say so and retry)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread
import psycopg
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ops.dashboard import action_routes, api, events, views
from ops.dashboard.config import DashboardSettings
from ops.dashboard.context import Dashboard
from ops.dashboard.regions import Views
from ops.dashboard.security import Guard
from ops.dashboard.text import short_error
from shared.errors import PipelineError
from shared.settings import Settings

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
SESSION_MAX_AGE_S = 8 * 3600


async def workers(request: Request) -> Response:
    """/workers is the page for a browser and the seed's JSON list for anything else."""
    if "text/html" in request.headers.get("accept", ""):
        return await views.workers_page(request)
    return await api.seed_workers(request)


def build_app(
    settings: Settings, dash: DashboardSettings, view_models: Views | None = None, https: bool = False
) -> Starlette:
    dashboard = Dashboard.build(settings, dash, view_models)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            await anyio.to_thread.run_sync(dashboard.operations.ensure_table)
        except (PipelineError, psycopg.Error) as exc:
            log.warning("the audit table is not there yet (made at the first action): %s", short_error(exc))
        try:
            yield
        finally:
            dashboard.views.links.close()  # the connections the samples and pages kept open

    routes = [
        *[r for r in views.ROUTES if not (isinstance(r, Route) and r.path == "/workers")],
        Route("/workers", workers),
        *action_routes.ROUTES,
        *[r for r in api.ROUTES if not (isinstance(r, Route) and r.path == "/workers")],
        *events.ROUTES,
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=dash.session_secret(),
                session_cookie="dashboard_session",
                max_age=SESSION_MAX_AGE_S,
                same_site="strict",
                https_only=https,
            ),
            Middleware(Guard, settings=dash),
        ],
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    return app
