"""What every route holds: the Dashboard (settings, read models, actions, the sampler hub), and
the caller the security middleware found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from ops.dashboard.actions import Actions, Actor, Operations
from ops.dashboard.config import DashboardSettings
from ops.dashboard.regions import Views
from ops.dashboard.sampler import Hub
from ops.dashboard.security import OPERATOR, Caller, LoginThrottle, csrf_token
from shared.settings import Settings


@dataclass
class Dashboard:
    settings: Settings
    dash: DashboardSettings
    views: Views
    operations: Operations
    actions: Actions
    hub: Hub
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    streams: int = 0  # SSE streams open now

    @classmethod
    def build(cls, settings: Settings, dash: DashboardSettings, views: Views | None = None) -> Dashboard:
        operations = Operations(settings)
        return cls(
            settings,
            dash,
            views or Views(settings, dash),
            operations,
            Actions(settings, operations),
            Hub(dash.refresh_s),
        )


def caller_of(request: Request) -> Caller:
    caller = request.scope.get("state", {}).get("caller")
    return caller if isinstance(caller, Caller) else Caller(None, "none")


def actor_of(request: Request) -> Actor:
    client = request.client.host if request.client else "?"
    return Actor(caller_of(request).role or "anonymous", client)


def can_act(dash: Dashboard, request: Request) -> bool:
    return caller_of(request).role == OPERATOR and not dash.dash.read_only


def page_context(dash: Dashboard, request: Request) -> dict[str, Any]:
    caller = caller_of(request)
    session = request.scope.get("session", {})
    return {
        "role": caller.role,
        "csrf": csrf_token(dash.dash, caller, session),
        "can_act": can_act(dash, request),
        "notice": notice(dash, request),
        "operations": [],
        "meta": dash.views.meta(),
        "header": {"workers": None, "parked": 0},  # a page that is not live shows no figures here
        "stream": None,
    }


def notice(dash: Dashboard, request: Request) -> str | None:
    """After a no-JavaScript action: what became of its operation."""
    op_id = request.query_params.get("op")
    op = dash.operations.get(op_id) if op_id else None
    if op is None:
        return None
    return f"{op.action} ({op.id}): {op.state} {op.progress}".strip()
