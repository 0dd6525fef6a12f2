"""Routing rules: which work queue (and message priority) a URL goes to.

Rules live in a TOML file (see default_routing.toml, the built-in rules, for the format). The
first rule whose conditions all hold wins; a URL no rule matches goes to the bulk queue.
A rule with `render = "always"` sends the URLs it matches to the render queue instead, where
the renderers (python -m renderer) load them in a browser; its `queue` may then be left out.
A mistake in the file is a ConfigError naming the file, the rule number and the field.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from shared.amqp.topology import MAX_MESSAGE_PRIORITY
from shared.errors import ConfigError
from shared.message_bounds import RENDER_KIND
from shared.messages import QUEUE_KINDS

DEFAULT_RULES_FILE = "default_routing.toml"
FALLBACK_QUEUE = "bulk"
# A lastmod this far in the future still counts as recent: clocks of web servers drift. Beyond
# it, a lastmod is more likely a trick to jump the queue than news.
CLOCK_SKEW_S = 3600.0
RULE_FIELDS = frozenset(
    {"queue", "url_pattern", "min_sitemap_priority", "lastmod_within_h", "message_priority", "render"}
)
RENDER_ALWAYS = "always"  # `render = "always"`: the URL goes to the renderers' queue


@dataclass(frozen=True)
class Route:
    queue: str
    message_priority: int = 0


@dataclass(frozen=True)
class Rule:
    queue: str
    url_pattern: re.Pattern[str] | None = None
    min_sitemap_priority: float | None = None
    lastmod_within_h: float | None = None
    message_priority: int = 0
    render: bool = False  # to the render queue (python -m renderer), not a worker's

    def matches(
        self, url: str, sitemap_priority: float | None, lastmod_at: datetime | None, now: float
    ) -> bool:
        if self.url_pattern is not None and not self.url_pattern.search(url):
            return False
        if self.min_sitemap_priority is not None and (
            sitemap_priority is None or sitemap_priority < self.min_sitemap_priority
        ):
            return False
        if self.lastmod_within_h is not None:
            if lastmod_at is None:
                return False
            age_s = now - lastmod_at.timestamp()
            if not -CLOCK_SKEW_S <= age_s <= self.lastmod_within_h * 3600.0:
                return False
        return True


@dataclass(frozen=True)
class Router:
    rules: tuple[Rule, ...]
    source: str  # the file the rules came from, for log lines

    def route(self, url: str, sitemap_priority: float | None, lastmod: str | None, now: float) -> Route:
        lastmod_at = parse_lastmod(lastmod) if lastmod else None
        for rule in self.rules:
            if rule.matches(url, sitemap_priority, lastmod_at, now):
                if rule.render:
                    return Route(RENDER_KIND)
                return Route(rule.queue, rule.message_priority)
        return Route(FALLBACK_QUEUE)


def parse_lastmod(text: str) -> datetime | None:
    """A sitemap <lastmod> (W3C datetime: YYYY, YYYY-MM, YYYY-MM-DD or a full timestamp) as an
    aware UTC datetime; None if it is not a date. A time without a zone is taken as UTC."""
    text = text.strip()
    if len(text) == 4:
        text += "-01-01"
    elif len(text) == 7:
        text += "-01"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def load_router(path: str = "") -> Router:
    """Rules from `path`, or the built-in rules when `path` is empty."""
    if path:
        name = path
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise ConfigError(f"routing file {path}: cannot read it ({exc.strerror})") from None
    else:
        name = f"built-in {DEFAULT_RULES_FILE}"
        raw = resources.files("producer").joinpath(DEFAULT_RULES_FILE).read_bytes()
    return Router(parse_rules(raw, name), name)


def parse_rules(raw: bytes, name: str) -> tuple[Rule, ...]:
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"routing file {name}: not valid TOML ({exc})") from None
    unknown = sorted(set(document) - {"rule"})
    if unknown:
        raise ConfigError(
            f"routing file {name}: unknown top-level key {unknown[0]!r} (rules go in [[rule]] tables)"
        )
    tables = document.get("rule")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"routing file {name}: no [[rule]] tables")
    return tuple(_rule(table, f"routing file {name}: rule {n}") for n, table in enumerate(tables, 1))


def _rule(table: dict[str, Any], where: str) -> Rule:
    unknown = sorted(set(table) - RULE_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}")
    render = table.get("render")
    if render is not None and render != RENDER_ALWAYS:
        raise ConfigError(f"{where}: field 'render': expected {RENDER_ALWAYS!r}, got {render!r}")
    queue = table.get("queue", FALLBACK_QUEUE if render else None)
    if queue not in QUEUE_KINDS:
        raise ConfigError(f"{where}: field 'queue': expected one of {', '.join(QUEUE_KINDS)}, got {queue!r}")
    pattern = table.get("url_pattern")
    compiled: re.Pattern[str] | None = None
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ConfigError(f"{where}: field 'url_pattern': expected a string")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{where}: field 'url_pattern': bad regular expression ({exc})") from None
    min_priority = _number(table, "min_sitemap_priority", where, 0.0, 1.0)
    within_h = _number(table, "lastmod_within_h", where, 0.0, None)
    message_priority = table.get("message_priority", 0)
    if (
        isinstance(message_priority, bool)
        or not isinstance(message_priority, int)
        or not (0 <= message_priority <= MAX_MESSAGE_PRIORITY)
    ):
        raise ConfigError(
            f"{where}: field 'message_priority': expected a whole number "
            f"0..{MAX_MESSAGE_PRIORITY}, got {message_priority!r}"
        )
    if message_priority and queue != "priority":
        raise ConfigError(
            f"{where}: field 'message_priority': only the priority queue "
            f"orders by it, this rule sends to {queue!r}"
        )
    return Rule(queue, compiled, min_priority, within_h, message_priority, render is not None)


def _number(table: dict[str, Any], key: str, where: str, low: float, high: float | None) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    in_range = low <= value and (high is None or value <= high) if _is_number(value) else False
    if not in_range:
        wanted = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{where}: field {key!r}: expected a number {wanted}, got {value!r}")
    return float(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
