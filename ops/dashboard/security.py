"""Who may do what, decided before a request reaches any route.

`Guard` is one ASGI middleware that, in this order:
1. answers 400 to a Host header outside the allow-list (DNS rebinding), before anything else;
2. refuses every method but GET, HEAD and OPTIONS on a path outside the action allow-list (405),
   before routing, so that a route added later is safe until listed;
3. finds the caller's role from a Bearer token, Basic (the token as password) or the session
   cookie; without DASHBOARD_TOKEN everyone is an operator (loopback only, config.py). A missing
   credential is a 401 for the API and a redirect to /login for pages;
4. on an unsafe request, checks the origin (Sec-Fetch-Site, then Origin), then a CSRF token for
   ambient credentials (cookie, Basic, or none at all from a browser), then the role and the
   read-only mode (403).
It also stamps the security headers on every response, refusals included.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

from ops.dashboard.config import DashboardSettings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPERATOR, VIEWER = "operator", "viewer"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Every path that may change anything, by POST only (no PUT, PATCH or DELETE anywhere).
# Nothing else gets past the gate.
ACTION_ROUTES = tuple(
    re.compile(pattern)
    for pattern in (
        r"/login",
        r"/logout",
        r"/api/v1/runs",
        r"/api/v1/runs/[^/]+/(pause|resume|cancel)",
        r"/api/v1/dead-letters/(replay|purge)",
    )
)
PUBLIC_PATHS = ("/healthz", "/readyz", "/login")
PUBLIC_PREFIX = "/static/"
# Answered with 401, never a redirect to the login page: what scripts and EventSource ask for.
API_PREFIXES = ("/api/", "/stats", "/events/")
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
MAX_FORM_BYTES = 1 << 20
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)
LOGIN_BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class Caller:
    role: str | None  # operator | viewer | None (no valid credential)
    kind: str  # bearer | basic | cookie | none


def constant_equal(given: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def role_of_token(settings: DashboardSettings, token: str) -> str | None:
    if constant_equal(token, settings.token):
        return OPERATOR
    if constant_equal(token, settings.view_token):
        return VIEWER
    return None


def identify(settings: DashboardSettings, headers: dict[str, str], session: dict[str, Any]) -> Caller:
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return Caller(role_of_token(settings, value.strip()), "bearer")
    if scheme.lower() == "basic":
        try:
            password = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            password = ""
        return Caller(role_of_token(settings, password), "basic")
    if not settings.auth_required:
        return Caller(OPERATOR, "none")
    role = session.get("role")
    if role in (OPERATOR, VIEWER) and session.get("token_mark") == token_mark(settings, role):
        return Caller(role, "cookie")
    return Caller(None, "none")


def token_mark(settings: DashboardSettings, role: str) -> str:
    """A short digest of the token a session logged in with: a token changed later ends it."""
    token = settings.token if role == OPERATOR else settings.view_token
    return hashlib.sha256(f"{role}:{token}".encode()).hexdigest()[:16]


def csrf_token(settings: DashboardSettings, caller: Caller, session: dict[str, Any]) -> str:
    """The token pages embed and ambient-credential requests must send back: an HMAC of the
    session's own secret, or of the credential kind when there is no session."""
    basis = session.get("csrf") or f"{caller.kind}:{caller.role}"
    return hmac.new(settings.session_secret().encode(), str(basis).encode(), hashlib.sha256).hexdigest()


def new_session(settings: DashboardSettings, role: str) -> dict[str, Any]:
    return {"role": role, "token_mark": token_mark(settings, role), "csrf": secrets.token_urlsafe(16)}


def origin_allowed(headers: dict[str, str], own_origin: str, kind: str) -> bool:
    """Sec-Fetch-Site when the browser sends it; else Origin against our own; else only a client
    that is no browser: one with a Bearer token, or any caller when auth is off (on loopback)."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is not None:
        return origin == own_origin
    return kind in ("bearer", "none")


def needs_csrf(headers: dict[str, str], kind: str) -> bool:
    """Ambient credentials ride on any request a browser sends: a cookie, Basic, or none at all
    (auth off) from a browser, which says so with Sec-Fetch-Site or Origin."""
    if kind in ("cookie", "basic"):
        return True
    return kind == "none" and ("sec-fetch-site" in headers or "origin" in headers)


def host_of(header: str) -> str:
    """The name of a Host header, without its port ('[::1]:8080' → '[::1]')."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class LoginThrottle:
    """Failed logins back off per client: 1 s, 2 s, 4 s ... up to 30 s, in memory."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}

    def wait_s(self, client: str) -> float:
        failures, at = self._failures.get(client, (0, 0.0))
        if not failures:
            return 0.0
        return max(0.0, at + min(LOGIN_BACKOFF_MAX_S, 2.0 ** (failures - 1)) - self._clock())

    def failed(self, client: str) -> None:
        if len(self._failures) > 10_000:
            self._failures.clear()
        self._failures[client] = (self._failures.get(client, (0, 0.0))[0] + 1, self._clock())

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)


class Guard:
    """The middleware of the module docstring. The session middleware must sit outside it."""

    def __init__(self, app: ASGIApp, settings: DashboardSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = with_security_headers(send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if host_of(headers.get("host", "")) not in self.settings.hosts_allowed():
            await respond(send, 400, {"error": "Host header not allowed (DASHBOARD_ALLOWED_HOSTS)"})
            return
        path = scope.get("path", "/")
        route = (
            path[len(scope.get("root_path", "")) :] if path.startswith(scope.get("root_path", "")) else path
        )
        method = scope["method"]
        unsafe = method not in SAFE_METHODS
        if unsafe and (method != "POST" or not any(p.fullmatch(route) for p in ACTION_ROUTES)):
            await respond(send, 405, {"error": f"{method} is not allowed here"}, [(b"allow", b"GET, HEAD")])
            return
        session: dict[str, Any] = scope.get("session", {})
        caller = identify(self.settings, headers, session)
        scope.setdefault("state", {})["caller"] = caller
        if route in PUBLIC_PATHS or route.startswith(PUBLIC_PREFIX):
            if unsafe and not origin_allowed(headers, own_origin(scope, headers), caller.kind):
                await respond(send, 403, {"error": "cross-origin request refused"})
                return
            await self.app(scope, receive, send)
            return
        if caller.role is None:
            await self.refuse_unknown(scope, send, route, caller)
            return
        if unsafe:
            checked = await self.check_unsafe(scope, receive, send, headers, caller, session)
            if checked is None:
                return
            receive = checked
        await self.app(scope, receive, send)

    async def refuse_unknown(self, scope: Scope, send: Send, route: str, caller: Caller) -> None:
        accept = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"accept"), "")
        wants_page = "text/html" in accept and not route.startswith(API_PREFIXES)
        if not wants_page or caller.kind in ("bearer", "basic") or scope["method"] != "GET":
            await respond(
                send, 401, {"error": "a valid token is required"}, [(b"www-authenticate", b"Bearer")]
            )
            return
        target = (
            scope.get("root_path", "")
            + route
            + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
        )
        location = f"{scope.get('root_path', '')}/login?next={quote(target, safe='/')}"
        await respond(send, 303, None, [(b"location", location.encode())])

    async def check_unsafe(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        caller: Caller,
        session: dict[str, Any],
    ) -> Receive | None:
        """The origin, CSRF, role and read-only checks; the receive to go on with, or None once
        refused. A form body is read here for its CSRF field and replayed to the route."""
        if not origin_allowed(headers, own_origin(scope, headers), caller.kind):
            await respond(send, 403, {"error": "cross-origin request refused"})
            return None
        if needs_csrf(headers, caller.kind):
            body, receive = await buffered(receive)
            given = headers.get(CSRF_HEADER) or form_field(headers, body, CSRF_FIELD)
            if not constant_equal(given, csrf_token(self.settings, caller, session)):
                await respond(send, 403, {"error": "missing or wrong CSRF token; reload the page"})
                return None
        if self.settings.read_only or caller.role != OPERATOR:
            reason = "the dashboard is read-only" if self.settings.read_only else "this token may only read"
            await respond(send, 403, {"error": reason})
            return None
        return receive


def own_origin(scope: Scope, headers: dict[str, str]) -> str:
    return f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"


def form_field(headers: dict[str, str], body: bytes, name: str) -> str:
    if not headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return ""
    values = parse_qs(body.decode("utf-8", "replace")).get(name, [""])
    return values[0]


async def buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request body (at most MAX_FORM_BYTES are kept), and a receive that gives it again."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= MAX_FORM_BYTES:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


def with_security_headers(send: Send) -> Send:
    async def stamped(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            message["headers"] = [
                *message.get("headers", []),
                *((k, v) for k, v in SECURITY_HEADERS if k not in present),
            ]
        await send(message)

    return stamped


async def respond(
    send: Send, status: int, payload: dict[str, str] | None, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(payload).encode() if payload is not None else b""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
