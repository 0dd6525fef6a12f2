"""The renderer's settings that can be wrong before any browser starts."""

from __future__ import annotations

import pytest

from renderer.chromium import require_chromium
from shared.errors import ConfigError
from shared.settings import Settings

pytestmark = pytest.mark.unit


def test_a_missing_chromium_is_one_line_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^CHROMIUM_PATH: '/nowhere/chromium' is not an executable"):
        require_chromium("/nowhere/chromium")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RENDER", "sometimes", "RENDER: expected 'off' or 'auto'"),
        ("RENDER_DEADLINE_S", "0", "RENDER_DEADLINE_S: must be positive"),
        ("BROWSER_MAX_PAGES", "0", "BROWSER_MAX_PAGES: must be at least 1"),
    ],
)
def test_render_settings_are_checked(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: value})
