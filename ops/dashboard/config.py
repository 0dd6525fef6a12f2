"""The dashboard's own settings (DASHBOARD_* in the environment, overridden by the command's
flags), and the rules that decide whether a configuration may serve at all.

They are kept apart from shared.settings.Settings on purpose: every pipeline container gets the
whole of Settings (docker-compose.yml passes every setting through), and the dashboard's tokens
must reach the dashboard's container only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from shared.errors import ConfigError

MIN_TOKEN_CHARS = 32
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class DashboardSettings:
    host: str = "127.0.0.1"  # bind address
    port: int = 8080  # the seed dashboard's port
    token: str = field(default="", repr=False)  # operator: read and act
    view_token: str = field(default="", repr=False)  # viewer: read only
    read_only: bool = False  # refuse every action, whoever asks
    allowed_hosts: tuple[str, ...] = ()  # Host header allow-list; empty = loopback names + host
    secret: str = field(default="", repr=False)  # signs the session cookie; empty = from the token
    refresh_s: float = 2.0  # base sampling interval, stretched when sampling is slow
    max_streams: int = 50  # live (SSE) streams at once; more get 503
    root_path: str = ""  # prefix the app is served under behind a reverse proxy

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> DashboardSettings:
        """DASHBOARD_<FIELD> from `environ`, then `overrides` (flags given), then validated."""
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f"DASHBOARD_{f.name.upper()}"
            raw = environ.get(name, "")
            if raw.strip():
                values[f.name] = _parse(name, raw.strip(), hints[f.name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        made = cls(**values)
        made.validate()
        return made

    def validate(self) -> None:
        for name, token in (("DASHBOARD_TOKEN", self.token), ("DASHBOARD_VIEW_TOKEN", self.view_token)):
            if token and len(token) < MIN_TOKEN_CHARS:
                raise ConfigError(
                    f"{name} must be at least {MIN_TOKEN_CHARS} characters "
                    "(python -m ops.dashboard --generate-token makes one)"
                )
        if self.view_token and not self.token:
            raise ConfigError("DASHBOARD_VIEW_TOKEN needs DASHBOARD_TOKEN too (the operator's)")
        if self.view_token and hmac.compare_digest(self.view_token, self.token):
            raise ConfigError("DASHBOARD_VIEW_TOKEN must differ from DASHBOARD_TOKEN")
        if not self.token and not is_loopback(self.host):
            raise ConfigError(
                f"DASHBOARD_TOKEN must be set to listen on {self.host} (only loopback may run without one)"
            )
        if not 0 < self.port < 65536:
            raise ConfigError(f"DASHBOARD_PORT {self.port} is not a TCP port")
        if not self.refresh_s > 0:
            raise ConfigError("DASHBOARD_REFRESH_S must be positive")
        if self.max_streams < 1:
            raise ConfigError("DASHBOARD_MAX_STREAMS must be at least 1")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ConfigError(
                f"DASHBOARD_ROOT_PATH {self.root_path!r} must start with '/' and not end with one"
            )

    @property
    def auth_required(self) -> bool:
        return bool(self.token)

    def hosts_allowed(self) -> tuple[str, ...]:
        """Host header names (without port) accepted: the configured list, or the loopback names
        and the bound host. 0.0.0.0 is no name a browser sends, so it adds nothing."""
        if self.allowed_hosts:
            return tuple(h.lower() for h in self.allowed_hosts)
        names = [*LOOPBACK_NAMES, "[::1]"]
        if self.host not in ("0.0.0.0", "::", ""):
            names.append(self.host.lower())
        return tuple(dict.fromkeys(names))

    def session_secret(self) -> str:
        """DASHBOARD_SECRET, or one derived from the token, so a new token logs everyone out. Without
        any token there are no sessions to sign; a fixed value keeps the middleware happy."""
        if self.secret:
            return self.secret
        return hmac.new(self.token.encode(), b"session", hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _parse(name: str, raw: str, hint: Any) -> Any:
    try:
        if hint is bool:
            if raw.lower() not in _TRUE + _FALSE:
                raise ValueError(raw)
            return raw.lower() in _TRUE
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
        if hint == tuple[str, ...]:
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        return raw
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not a valid {getattr(hint, '__name__', hint)}") from None
