"""Text from the web, made safe to show: one line, passwords redacted, cut short."""

from __future__ import annotations

from shared.settings import redact

ERROR_TEXT_CHARS = 200
SAFE_SCHEMES = ("http://", "https://")


def short_error(text: object, limit: int = ERROR_TEXT_CHARS) -> str:
    lines = str(text or "").strip().splitlines()
    shown = redact(" ".join(lines[0].split())) if lines else ""
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def linkable(url: object) -> bool:
    """Only http(s) URLs become links; anything else (javascript:, data:, ...) stays text."""
    return isinstance(url, str) and url.lower().startswith(SAFE_SCHEMES)


def whole(value: object) -> int:
    """A count as the database returns it (psycopg types rows as objects)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"not a count: {value!r}")
    return int(value)
