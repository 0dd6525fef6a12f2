"""The Guard middleware, around a small app that counts what reaches it: the Host check, the
unsafe-method gate, the auth matrix, the origin check, CSRF tokens and the read-only mode."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from ops.dashboard.config import DashboardSettings
from ops.dashboard.context import caller_of
from ops.dashboard.security import (
    CSP,
    Caller,
    LoginThrottle,
    csrf_token,
    host_of,
    new_session,
    origin_allowed,
    role_of_token,
)
from tests.fakes import FakeTime

pytestmark = pytest.mark.unit

TOKEN = "operator-token-" + "o" * 20
VIEW = "viewer-token-" + "v" * 20
ORIGIN = "http://127.0.0.1:8080"
ACTION = "/api/v1/runs/r1/pause"
UNSAFE = ("POST", "PUT", "DELETE", "PATCH")


class Reached:
    """The app behind the Guard: it records every request that got through."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    async def handle(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path))
        caller = caller_of(request)
        if request.url.path == "/login" and request.method == "POST":
            request.session.update(new_session(settings_of(request), "operator"))
        if request.url.path == "/csrf":
            token = csrf_token(settings_of(request), caller, request.scope.get("session", {}))
            return JSONResponse({"csrf": token})
        return JSONResponse({"role": caller.role, "kind": caller.kind})


def settings_of(request: Request) -> DashboardSettings:
    dash: DashboardSettings = request.app.state.dash
    return dash


def make(dash: DashboardSettings) -> tuple[TestClient, Reached]:
    from ops.dashboard.security import Guard

    reached = Reached()
    paths = [
        "/",
        "/api/v1/overview",
        ACTION,
        "/api/v1/dead-letters/replay",
        "/login",
        "/logout",
        "/csrf",
        "/api/v1/anything",
        "/healthz",
        "/workers",
    ]
    app = Starlette(
        routes=[Route(p, reached.handle, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]) for p in paths],
        middleware=[
            Middleware(SessionMiddleware, secret_key=dash.session_secret(), same_site="strict"),
            Middleware(Guard, settings=dash),
        ],
    )
    app.state.dash = dash
    return TestClient(app, base_url=ORIGIN, follow_redirects=False), reached


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f":{token}".encode()).decode()}


@pytest.fixture
def guarded() -> tuple[TestClient, Reached]:
    return make(DashboardSettings(token=TOKEN, view_token=VIEW))


def test_a_foreign_host_gets_400_before_anything_else(guarded: tuple[TestClient, Reached]) -> None:
    client, reached = guarded
    answer = client.get("/healthz", headers={"Host": "evil.example"})
    assert answer.status_code == 400
    assert answer.headers["content-security-policy"] == CSP
    for host in ("127.0.0.1:8080", "localhost", "[::1]:8080"):
        assert client.get("/healthz", headers={"Host": host}).status_code == 200
    assert reached.requests == [("GET", "/healthz")] * 3


@pytest.mark.parametrize("method", UNSAFE)
@pytest.mark.parametrize("path", ["/", "/api/v1/overview", "/api/v1/anything", "/healthz", "/workers"])
def test_unsafe_methods_outside_the_allow_list_never_reach_a_handler(
    guarded: tuple[TestClient, Reached], method: str, path: str
) -> None:
    client, reached = guarded
    answer = client.request(method, path, headers=bearer(TOKEN))
    assert answer.status_code == 405
    assert reached.requests == []


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_only_post_acts_even_on_an_action_route(guarded: tuple[TestClient, Reached], method: str) -> None:
    client, reached = guarded
    assert client.request(method, ACTION, headers=bearer(TOKEN)).status_code == 405
    assert reached.requests == []


@pytest.mark.parametrize(
    ("headers", "role", "kind"),
    [
        (bearer(TOKEN), "operator", "bearer"),
        (bearer(VIEW), "viewer", "bearer"),
        (basic(TOKEN), "operator", "basic"),
        (basic(VIEW), "viewer", "basic"),
    ],
)
def test_credentials_give_their_role(
    guarded: tuple[TestClient, Reached], headers: dict[str, str], role: str, kind: str
) -> None:
    client, _ = guarded
    assert client.get("/api/v1/overview", headers=headers).json() == {"role": role, "kind": kind}


@pytest.mark.parametrize(
    "headers", [{}, bearer("wrong" * 8), basic("wrong" * 8), {"Authorization": "Basic !!"}]
)
def test_no_valid_credential_is_401_for_the_api(
    guarded: tuple[TestClient, Reached], headers: dict[str, str]
) -> None:
    client, reached = guarded
    answer = client.get("/api/v1/overview", headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert reached.requests == []


def test_a_browser_without_a_session_is_sent_to_the_login_page(guarded: tuple[TestClient, Reached]) -> None:
    client, _ = guarded
    answer = client.get("/?x=1", headers={"Accept": "text/html"})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login?next=/%3Fx%3D1"
    # The seed's /workers is JSON for scripts: a 401, never a redirect.
    assert client.get("/workers", headers={"Accept": "*/*"}).status_code == 401
    assert client.get("/healthz").status_code == 200  # no auth, no data


def test_a_session_cookie_needs_a_csrf_token_to_act(guarded: tuple[TestClient, Reached]) -> None:
    client, reached = guarded
    same = {"Sec-Fetch-Site": "same-origin"}
    assert client.post("/login", headers=same).status_code == 200  # sets the session
    assert client.get("/api/v1/overview").json() == {"role": "operator", "kind": "cookie"}
    token = client.get("/csrf").json()["csrf"]
    assert client.post(ACTION, headers=same).status_code == 403
    assert client.post(ACTION, headers={**same, "X-CSRF-Token": "0" * 64}).status_code == 403
    assert client.post(ACTION, headers={**same, "X-CSRF-Token": token}).status_code == 200
    form = client.post(ACTION, headers=same, data={"csrf_token": token, "next": "/"})
    assert form.status_code == 200
    assert reached.requests.count(("POST", ACTION)) == 2


def test_basic_is_an_ambient_credential_too(guarded: tuple[TestClient, Reached]) -> None:
    client, _ = guarded
    headers = {**basic(TOKEN), "Origin": ORIGIN}
    assert client.post(ACTION, headers=headers).status_code == 403
    token = client.get("/csrf", headers=basic(TOKEN)).json()["csrf"]
    assert client.post(ACTION, headers={**headers, "X-CSRF-Token": token}).status_code == 200


@pytest.mark.parametrize(
    ("fetch_site", "origin", "allowed"),
    [
        ("same-origin", None, True),
        ("none", None, True),
        ("same-site", None, False),
        ("cross-site", None, False),
        ("cross-site", ORIGIN, False),  # Sec-Fetch-Site wins over a matching Origin
        (None, ORIGIN, True),
        (None, "http://evil.example", False),
        (None, "null", False),
        (None, "http://127.0.0.1:8081", False),
    ],
)
@pytest.mark.parametrize("kind", ["bearer", "cookie", "basic"])
def test_origin_matrix(fetch_site: str | None, origin: str | None, allowed: bool, kind: str) -> None:
    headers = {k: v for k, v in (("sec-fetch-site", fetch_site), ("origin", origin)) if v is not None}
    assert origin_allowed(headers, ORIGIN, kind) is allowed


@pytest.mark.parametrize(
    ("kind", "allowed"), [("bearer", True), ("none", True), ("cookie", False), ("basic", False)]
)
def test_without_either_header_only_a_non_browser_client_passes(kind: str, allowed: bool) -> None:
    assert origin_allowed({}, ORIGIN, kind) is allowed


def test_cross_site_posts_are_refused_with_any_credential(guarded: tuple[TestClient, Reached]) -> None:
    client, reached = guarded
    for headers in (bearer(TOKEN), basic(TOKEN), {}):
        answer = client.post(ACTION, headers={**headers, "Sec-Fetch-Site": "cross-site"})
        assert answer.status_code in (401, 403)
    assert client.post("/login", headers={"Origin": "http://evil.example"}).status_code == 403  # login CSRF
    assert reached.requests == []


def test_a_viewer_and_the_read_only_mode_refuse_every_action() -> None:
    client, reached = make(DashboardSettings(token=TOKEN, view_token=VIEW))
    answer = client.post(ACTION, headers=bearer(VIEW))
    assert (answer.status_code, answer.json()) == (403, {"error": "this token may only read"})
    client, reached = make(DashboardSettings(token=TOKEN, read_only=True))
    answer = client.post(ACTION, headers=bearer(TOKEN))
    assert (answer.status_code, answer.json()) == (403, {"error": "the dashboard is read-only"})
    assert client.get("/api/v1/overview", headers=bearer(TOKEN)).status_code == 200
    assert reached.requests == [("GET", "/api/v1/overview")]


def test_without_a_token_on_loopback_scripts_act_and_browsers_need_the_token() -> None:
    client, reached = make(DashboardSettings())
    assert client.post(ACTION).status_code == 200  # curl on this machine: no Origin, no Sec-Fetch-Site
    assert client.post(ACTION, headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post(ACTION, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert client.post(ACTION, headers={"Sec-Fetch-Site": "same-origin"}).status_code == 403  # no CSRF token
    token = client.get("/csrf").json()["csrf"]
    headers = {"Sec-Fetch-Site": "same-origin", "X-CSRF-Token": token}
    assert client.post(ACTION, headers=headers).status_code == 200
    assert reached.requests.count(("POST", ACTION)) == 2


def test_every_response_carries_the_security_headers(guarded: tuple[TestClient, Reached]) -> None:
    client, _ = guarded
    for answer in (client.get("/healthz"), client.get("/api/v1/overview"), client.delete("/")):
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"
        assert not any(h.lower().startswith("access-control-") for h in answer.headers)


def test_a_changed_token_ends_the_sessions_made_with_the_old_one() -> None:
    old = DashboardSettings(token=TOKEN)
    session: dict[str, Any] = new_session(old, "operator")
    from ops.dashboard.security import identify

    assert identify(old, {}, session) == Caller("operator", "cookie")
    assert identify(DashboardSettings(token="n" * 32), {}, session) == Caller(None, "none")


def test_tokens_are_compared_for_their_role() -> None:
    dash = DashboardSettings(token=TOKEN, view_token=VIEW)
    assert (role_of_token(dash, TOKEN), role_of_token(dash, VIEW), role_of_token(dash, "")) == (
        "operator",
        "viewer",
        None,
    )


def test_host_of_strips_the_port() -> None:
    assert [host_of(h) for h in ("LocalHost:8080", "[::1]:80", "[::1]", "127.0.0.1", "a:b:c")] == [
        "localhost",
        "[::1]",
        "[::1]",
        "127.0.0.1",
        "a:b:c",
    ]


def test_failed_logins_back_off() -> None:
    clock = FakeTime()
    throttle = LoginThrottle(clock)
    assert throttle.wait_s("c") == 0
    for _ in range(3):
        throttle.failed("c")
    assert throttle.wait_s("c") == 4.0
    for _ in range(10):
        throttle.failed("c")
    assert throttle.wait_s("c") == 30.0
    clock.sleep(30)
    assert throttle.wait_s("c") == 0
    throttle.succeeded("c")
    throttle.failed("c")
    assert throttle.wait_s("c") == 1.0
