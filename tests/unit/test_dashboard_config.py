"""The dashboard's settings, and when a configuration may not serve at all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ops.dashboard.config import DashboardSettings, is_loopback
from shared.errors import ConfigError

pytestmark = pytest.mark.unit

TOKEN = "o" * 32
VIEW = "v" * 32


def test_loopback_serves_without_a_token() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert not DashboardSettings.from_env({"DASHBOARD_HOST": host}).auth_required


def test_any_other_address_needs_a_token() -> None:
    with pytest.raises(ConfigError) as refused:
        DashboardSettings.from_env({}, host="0.0.0.0")
    assert str(refused.value) == (
        "DASHBOARD_TOKEN must be set to listen on 0.0.0.0 (only loopback may run without one)"
    )
    assert DashboardSettings.from_env({"DASHBOARD_TOKEN": TOKEN}, host="0.0.0.0").auth_required


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DASHBOARD_TOKEN": "short"}, "DASHBOARD_TOKEN must be at least 32 characters"),
        ({"DASHBOARD_VIEW_TOKEN": VIEW}, "DASHBOARD_VIEW_TOKEN needs DASHBOARD_TOKEN too"),
        ({"DASHBOARD_TOKEN": TOKEN, "DASHBOARD_VIEW_TOKEN": TOKEN}, "must differ"),
        ({"DASHBOARD_PORT": "http"}, "DASHBOARD_PORT='http': not a valid int"),
        ({"DASHBOARD_PORT": "70000"}, "not a TCP port"),
        ({"DASHBOARD_READ_ONLY": "maybe"}, "DASHBOARD_READ_ONLY='maybe'"),
        ({"DASHBOARD_REFRESH_S": "0"}, "DASHBOARD_REFRESH_S must be positive"),
        ({"DASHBOARD_ROOT_PATH": "dash/"}, "DASHBOARD_ROOT_PATH"),
    ],
)
def test_mistakes_are_one_line_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        DashboardSettings.from_env(env)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_flags_override_the_environment() -> None:
    made = DashboardSettings.from_env({"DASHBOARD_PORT": "9000", "DASHBOARD_READ_ONLY": "true"}, port=9100)
    assert (made.port, made.read_only) == (9100, True)


def test_allowed_hosts_default_to_loopback_and_the_bound_host() -> None:
    assert set(DashboardSettings().hosts_allowed()) == {"localhost", "127.0.0.1", "::1", "[::1]"}
    bound = DashboardSettings(host="10.1.2.3", token=TOKEN).hosts_allowed()
    assert "10.1.2.3" in bound
    assert "0.0.0.0" not in DashboardSettings(host="0.0.0.0", token=TOKEN).hosts_allowed()
    listed = DashboardSettings.from_env({"DASHBOARD_ALLOWED_HOSTS": "Dash.Example, localhost"})
    assert listed.hosts_allowed() == ("dash.example", "localhost")


def test_session_secret_follows_the_token() -> None:
    one, other = DashboardSettings(token=TOKEN), DashboardSettings(token="p" * 32)
    assert one.session_secret() != other.session_secret()
    assert DashboardSettings(token=TOKEN, secret="s").session_secret() == "s"


def test_tokens_never_show_in_repr() -> None:
    assert TOKEN not in repr(DashboardSettings(token=TOKEN, view_token=VIEW))


def test_is_loopback() -> None:
    assert is_loopback("[::1]") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")


def test_the_command_exits_2_with_one_line_off_loopback_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASHBOARD_")}
    done = subprocess.run(
        [sys.executable, "-m", "ops.dashboard", "--host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "dashboard: error: DASHBOARD_TOKEN must be set to listen on 0.0.0.0 "
        "(only loopback may run without one)"
    ]


def test_generate_token_prints_a_usable_token() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ops.dashboard", "--generate-token"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    DashboardSettings(token=done.stdout.strip()).validate()
