"""The HTML pages. Each is complete at GET (the live stream only replaces its regions), and
every figure in it comes from the same context the stream renders (regions.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ops.dashboard import deadletters
from ops.dashboard.context import Dashboard, actor_of, page_context
from ops.dashboard.security import OPERATOR, new_session, role_of_token
from shared.errors import ConfigError, PipelineError

MAX_REFRESH_S = 3600


def html(
    dash: Dashboard, request: Request, template: str, ctx: dict[str, Any], status: int = 200
) -> Response:
    body = dash.views.page(template, {**page_context(dash, request), **ctx})
    response = HTMLResponse(body, status_code=status)
    refresh = request.query_params.get("refresh", "")
    if refresh.isdigit() and 0 < int(refresh) <= MAX_REFRESH_S:
        response.headers["Refresh"] = refresh  # a wallboard without JavaScript
    return response


def error_page(dash: Dashboard, request: Request, status: int, message: str) -> Response:
    return html(
        dash,
        request,
        "error.html",
        {"status": status, "message": message},
        status,
    )


async def live_page(
    request: Request,
    kind: str,
    arg: Any,
    template: str,
    stream: str,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> Response:
    dash: Dashboard = request.app.state.dashboard

    def build() -> dict[str, Any]:
        ctx = dash.views.context(kind, arg)
        return {**ctx, **(extra() if extra else {})}

    try:
        ctx = await anyio.to_thread.run_sync(build)
    except ConfigError as exc:
        return error_page(dash, request, 400, str(exc))
    except PipelineError as exc:
        return error_page(dash, request, 503, str(exc))
    return html(dash, request, template, {**ctx, "stream": stream})


async def runs_page(request: Request) -> Response:
    return await live_page(request, "overview", None, "runs.html", "/events/overview")


async def run_page(request: Request) -> Response:
    dash: Dashboard = request.app.state.dashboard
    run_id = request.path_params["run_id"]
    ops = lambda: {"operations": [op.view() for op in dash.operations.latest(run_id)]}  # noqa: E731
    return await live_page(request, "run", run_id, "run.html", f"/events/runs/{run_id}", ops)


async def queues_page(request: Request) -> Response:
    return await live_page(request, "queues", None, "queues.html", "/events/queues")


async def workers_page(request: Request) -> Response:
    return await live_page(request, "workers", None, "workers.html", "/events/workers")


async def dead_letters_page(request: Request) -> Response:
    dash: Dashboard = request.app.state.dashboard
    try:
        shown = deadletters.Filter.from_query(request.query_params)
        after = request.query_params.get("after_id", "")
        after_id = int(after) if after.isdigit() else None
    except ConfigError as exc:
        return error_page(dash, request, 400, str(exc))

    def listed() -> dict[str, Any]:
        rows = deadletters.rows(dash.views.links, shown, after_id)
        last = rows[-1]["id"] if len(rows) == deadletters.PAGE_SIZE else None
        return {"rows": rows, "next_after": last}

    query = request.url.query
    return await live_page(
        request,
        "dead-letters",
        shown,
        "dead_letters.html",
        "/events/dead-letters" + (f"?{query}" if query else ""),
        listed,
    )


async def dead_letter_page(request: Request) -> Response:
    dash: Dashboard = request.app.state.dashboard
    row_id = int(request.path_params["row_id"])
    try:
        row = await anyio.to_thread.run_sync(deadletters.detail, dash.views.links, row_id)
    except PipelineError as exc:
        return error_page(dash, request, 503, str(exc))
    if row is None:
        return error_page(dash, request, 404, f"no dead letter {row_id}")
    return html(
        dash,
        request,
        "dead_letter.html",
        {"row": row},
    )


async def confirm_page(request: Request) -> Response:
    """The dry run of a replay or purge, and the form that carries its count back."""
    dash: Dashboard = request.app.state.dashboard
    query = request.query_params
    action = query.get("action", "replay")
    ids = [int(i) for i in query.getlist("id") if i.isdigit()]
    try:
        if action not in ("replay", "purge"):
            raise ConfigError("action must be replay or purge")
        shown = deadletters.Filter.from_query(query)
        state = shown.state if action == "purge" else "dead"
        if action == "purge" and "state" not in query:
            state = "replayed"  # purging defaults to the rows outside the accounting
        selection = shown.selection().__class__(shown.run, shown.reason, state)
    except ConfigError as exc:
        return error_page(dash, request, 400, str(exc))
    actor = actor_of(request)

    def dry() -> dict[str, Any]:
        if action == "replay":
            found = dash.actions.replay(actor, selection, None, None, ids or None)
        else:
            found = dash.actions.purge(actor, selection, None, None, ids or None, state != "replayed")
        assert isinstance(found, dict)
        return {
            "count": found.get("would_replay", found.get("would_delete", 0)),
            "max_id": found["max_id"],
            "dead_outcomes_lost": found.get("dead_outcomes_lost", 0),
        }

    try:
        counted = await anyio.to_thread.run_sync(dry)
    except PipelineError as exc:
        return error_page(dash, request, 503, str(exc))
    fields = {
        k: v
        for k, v in {"run_id": selection.run_id, "reason": selection.reason, "state": selection.state}.items()
        if v
    }
    if action == "purge" and state != "replayed":
        fields["include_dead"] = "true"
    back = f"{dash.dash.root_path}/dead-letters?{urlencode(shown.params())}"
    return html(
        dash,
        request,
        "confirm.html",
        {
            "action": action,
            "selection": selection,
            "ids": ids,
            "dry": counted,
            "fields": fields,
            "back": back,
            "refusal": None,
        },
    )


async def login_page(request: Request) -> Response:
    dash: Dashboard = request.app.state.dashboard
    if not dash.dash.auth_required:
        return RedirectResponse(dash.dash.root_path + "/", 303)
    return html(
        dash,
        request,
        "login.html",
        {
            "next": safe_next(request.query_params.get("next"), dash),
            "login_error": None,
        },
    )


async def login(request: Request) -> Response:
    dash: Dashboard = request.app.state.dashboard
    form = await request.form()
    client = request.client.host if request.client else "?"
    target = safe_next(str(form.get("next", "")), dash)
    wait_s = dash.throttle.wait_s(client)
    role = None if wait_s > 0 else role_of_token(dash.dash, str(form.get("token", "")))
    if role is None:
        if wait_s <= 0:
            dash.throttle.failed(client)
        message = f"too many tries: wait {wait_s:.0f} s" if wait_s > 0 else "wrong token"
        return html(
            dash,
            request,
            "login.html",
            {"next": target, "login_error": message},
            401,
        )
    dash.throttle.succeeded(client)
    request.session.clear()
    request.session.update(new_session(dash.dash, role))
    return RedirectResponse(target, 303)


async def logout(request: Request) -> Response:
    request.session.clear()
    dash: Dashboard = request.app.state.dashboard
    return RedirectResponse(dash.dash.root_path + "/login", 303)


def safe_next(target: str | None, dash: Dashboard) -> str:
    """Only a path of this site: never another host ("//evil", "https://evil")."""
    root = dash.dash.root_path
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return root + "/"
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else root + "/"


ROUTES = [
    Route("/", runs_page),
    Route("/runs/{run_id}", run_page),
    Route("/queues", queues_page),
    Route("/workers", workers_page),
    Route("/dead-letters", dead_letters_page),
    Route("/dead-letters/confirm", confirm_page),
    Route("/dead-letters/{row_id:int}", dead_letter_page),
    Route("/login", login_page, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
]
__all__ = ["OPERATOR", "ROUTES", "safe_next"]
