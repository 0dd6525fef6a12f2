"""CHROMIUM_PATH checked without Playwright: `ops.crawl` asks before it starts renderers, in an
image that may carry no Playwright at all."""

from __future__ import annotations

import os

from shared.errors import ConfigError


def require_chromium(path: str) -> None:
    """A CHROMIUM_PATH that is not there, refused in one line before anything starts."""
    if not os.access(path, os.X_OK):
        raise ConfigError(
            f"CHROMIUM_PATH: {path!r} is not an executable (apt-get install --no-install-recommends chromium)"
        )
