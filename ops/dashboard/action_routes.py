"""The POST routes of the actions. Each takes JSON (scripts, `curl`) or a form (the pages,
without JavaScript). JSON gets 202 {"operation": id} or {"error"}; a form gets a redirect back
to the page it came from, which then shows the operation, or an error page with the status."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio.to_thread
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from dlq_consumer import store
from ops.dashboard.actions import ActionRefused, Actor, Operation
from ops.dashboard.context import Dashboard, actor_of
from ops.dashboard.views import error_page, safe_next
from ops.submit import submit
from shared.errors import ConfigError, PipelineError

MAX_BODY_BYTES = 1 << 20


async def bounded_body(request: Request) -> bytes:
    """The body, refused once it passes MAX_BODY_BYTES (never read whole into memory first)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ConfigError("the request body is over 1 MiB")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ConfigError("the request body is over 1 MiB")
        chunks.append(chunk)
    return b"".join(chunks)


class Posted:
    """A request's fields, from JSON or a form alike."""

    def __init__(self, fields: dict[str, Any], form: bool, ids: list[int] | None) -> None:
        self.fields = fields
        self.form = form
        self.ids = ids

    @classmethod
    async def read(cls, request: Request) -> Posted:
        if request.headers.get("content-type", "").startswith(
            ("application/x-www-form-urlencoded", "multipart/")
        ):
            form: FormData = await request.form()
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
            ids = [int(i) for i in form.getlist("id") if isinstance(i, str) and i.isdigit()]
            return cls(fields, True, ids or None)
        body = await bounded_body(request)
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            raise ConfigError("the body is not JSON") from None
        if not isinstance(parsed, dict):
            raise ConfigError("the body must be a JSON object")
        nested = parsed.get("selection")
        fields = {**(nested if isinstance(nested, dict) else {}), **parsed}
        listed = fields.get("ids")
        if listed is not None and not (isinstance(listed, list) and all(isinstance(i, int) for i in listed)):
            raise ConfigError("ids must be a list of integers")
        return cls(fields, False, listed)

    def text(self, name: str) -> str | None:
        value = self.fields.get(name)
        return str(value) if value not in (None, "") else None

    def number(self, name: str) -> int | None:
        value = self.fields.get(name)
        if value in (None, ""):
            return None
        if isinstance(value, bool) or not str(value).isdigit():
            raise ConfigError(f"{name} must be a whole number")
        return int(value)

    def flag(self, name: str) -> bool:
        return str(self.fields.get(name, "")).lower() in ("1", "true", "yes", "on")

    def dry_run(self) -> bool:
        return self.flag("dry_run") or self.number("expected") is None

    def selection(self, default_state: str) -> store.Selection:
        state = self.text("state") or default_state
        if state not in store.STATES:
            raise ConfigError(f"state must be one of {', '.join(store.STATES)}")
        return store.Selection(
            run_id=self.text("run_id") or self.text("run"), reason=self.text("reason"), state=state
        )


def done(request: Request, posted: Posted, outcome: dict[str, Any] | Operation) -> Response:
    dash: Dashboard = request.app.state.dashboard
    if isinstance(outcome, dict):
        return JSONResponse(outcome)
    if posted.form:
        target = safe_next(posted.text("next"), dash)
        return RedirectResponse(target + ("&" if "?" in target else "?") + f"op={outcome.id}", 303)
    return JSONResponse(
        {"operation": outcome.id, **({"run_id": outcome.run_id} if outcome.run_id else {})}, 202
    )


def refused(request: Request, posted: Posted | None, status: int, message: str, **extra: Any) -> Response:
    if posted is not None and posted.form:
        return error_page(request.app.state.dashboard, request, status, message)
    return JSONResponse({"error": message, **extra}, status)


Outcome = dict[str, Any] | Operation  # a dry run's counts, or the operation started
# An action: the dashboard, the fields posted, who asks, and the route's path parameters.
Act = Callable[[Dashboard, Posted, Actor, Mapping[str, Any]], Outcome]


def action_route(act: Act) -> Callable[[Request], Awaitable[Response]]:
    """A POST route of one action: the fields read, `act` run in a worker thread (the project's
    clients are synchronous), and its outcome, or its refusal, answered in the request's kind."""

    async def route(request: Request) -> Response:
        dash: Dashboard = request.app.state.dashboard
        posted = None
        try:
            posted = await Posted.read(request)
            read = posted
            actor, path = actor_of(request), request.path_params
            outcome = await anyio.to_thread.run_sync(lambda: act(dash, read, actor, path))
        except ActionRefused as exc:
            return refused(request, posted, exc.status, str(exc), **exc.extra)
        except ConfigError as exc:
            return refused(request, posted, 400, str(exc))
        except PipelineError as exc:
            return refused(request, posted, 503, str(exc))
        return done(request, posted, outcome)

    return route


def act_on_run(dash: Dashboard, posted: Posted, actor: Actor, path: Mapping[str, Any]) -> Outcome:
    """Pause, resume or cancel (which must be confirmed by the run id)."""
    return dash.actions.run_action(actor, path["action"], path["run_id"], posted.text("confirm"))


def replay_dead_letters(dash: Dashboard, posted: Posted, actor: Actor, _path: Mapping[str, Any]) -> Outcome:
    expected = None if posted.dry_run() else posted.number("expected")
    return dash.actions.replay(actor, posted.selection("dead"), expected, posted.number("max_id"), posted.ids)


def purge_dead_letters(dash: Dashboard, posted: Posted, actor: Actor, _path: Mapping[str, Any]) -> Outcome:
    expected = None if posted.dry_run() else posted.number("expected")
    if posted.form and expected is not None and posted.text("typed") != str(expected):
        raise ConfigError(f"type {expected} to purge")  # the no-JavaScript form's typed count
    return dash.actions.purge(
        actor,
        posted.selection("replayed"),
        expected,
        posted.number("max_id"),
        posted.ids,
        posted.flag("include_dead"),
    )


async def submit_run(request: Request) -> Response:
    """POST /api/v1/runs: a crawl request, checked and queued for the producer service by
    ops.submit (the same as python -m ops.submit); 202 {"run_id", "operation"}."""
    dash: Dashboard = request.app.state.dashboard
    try:
        body = await bounded_body(request)
        submitted = await anyio.to_thread.run_sync(lambda: submit(dash.settings, body))
    except ConfigError as exc:  # InvalidRequest among them: one line, nothing queued
        return JSONResponse({"error": str(exc)}, 400)
    except PipelineError as exc:
        return JSONResponse({"error": str(exc)}, 503)
    actor = actor_of(request)
    await anyio.to_thread.run_sync(
        lambda: dash.operations.audit(actor, "submit", submitted.run_id, {"operation": submitted.operation})
    )
    return JSONResponse({"run_id": submitted.run_id, "operation": submitted.operation}, 202)


ROUTES = [
    Route("/api/v1/runs", submit_run, methods=["POST"]),
    Route("/api/v1/runs/{run_id}/{action:str}", action_route(act_on_run), methods=["POST"]),
    Route("/api/v1/dead-letters/replay", action_route(replay_dead_letters), methods=["POST"]),
    Route("/api/v1/dead-letters/purge", action_route(purge_dead_letters), methods=["POST"]),
]
