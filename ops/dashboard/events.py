"""The live streams: one Server-Sent Events stream per page. Each message is one JSON object:
{"regions": {id: html, ...} (only those that changed for this client), "at", "interval_s",
"error"}. Viewers of the same scope share one sampler (sampler.py); those who may act and those
who may not see different buttons, so they are two scopes. Fragments carry no per-session
secret: app.js copies the page's CSRF token into the forms it receives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ops.dashboard import deadletters
from ops.dashboard.context import Dashboard, can_act
from ops.dashboard.sampler import Sampler, Subscriber, TooManyScopes
from shared.errors import ConfigError

PING_S = 15
SEND_TIMEOUT_S = 10


def producer(dash: Dashboard, kind: str, arg: Any, acting: bool) -> Callable[[], dict[str, str]]:
    def produce() -> dict[str, str]:
        ctx = dash.views.context(kind, arg)
        ops = [op.view() for op in dash.operations.latest(arg)] if kind == "run" else []
        return dash.views.regions(kind, {**ctx, "can_act": acting, "csrf": "", "operations": ops})

    return produce


async def stream(request: Request, kind: str, arg: Any, scope: str) -> Response:
    dash: Dashboard = request.app.state.dashboard
    if dash.streams >= dash.dash.max_streams:
        return JSONResponse({"error": f"{dash.dash.max_streams} live streams are open already"}, 503)
    acting = can_act(dash, request)
    try:
        sampler, subscriber = dash.hub.subscribe(
            f"{scope}:{'act' if acting else 'view'}", producer(dash, kind, arg, acting)
        )
    except TooManyScopes as exc:
        return JSONResponse({"error": str(exc)}, 503)
    dash.streams += 1
    return EventSourceResponse(
        messages(dash, sampler, subscriber),
        ping=PING_S,
        send_timeout=SEND_TIMEOUT_S,
        headers={"Cache-Control": "no-store"},
    )


async def messages(
    dash: Dashboard, sampler: Sampler, subscriber: Subscriber
) -> AsyncIterator[dict[str, str]]:
    try:
        while True:
            sample = await subscriber.pending.get()
            payload = {
                "regions": subscriber.changes(sample),
                "at": sample.at,
                "interval_s": round(sample.interval_s, 2),
                "error": sample.error,
            }
            yield {"data": json.dumps(payload, separators=(",", ":"))}
    finally:
        dash.streams -= 1
        sampler.unsubscribe(subscriber)


async def overview_events(request: Request) -> Response:
    return await stream(request, "overview", None, "overview")


async def run_events(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    return await stream(request, "run", run_id, f"run:{run_id}")


async def queues_events(request: Request) -> Response:
    return await stream(request, "queues", None, "queues")


async def workers_events(request: Request) -> Response:
    return await stream(request, "workers", None, "workers")


async def dead_letter_events(request: Request) -> Response:
    try:
        shown = deadletters.Filter.from_query(request.query_params)
    except ConfigError as exc:
        return JSONResponse({"error": str(exc)}, 400)
    key = json.dumps(shown.params(), sort_keys=True)
    return await stream(request, "dead-letters", shown, f"dead-letters:{key}")


ROUTES = [
    Route("/events/overview", overview_events),
    Route("/events/runs/{run_id}", run_events),
    Route("/events/queues", queues_events),
    Route("/events/workers", workers_events),
    Route("/events/dead-letters", dead_letter_events),
]
