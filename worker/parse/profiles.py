"""Extraction profiles: named fields pulled from pages by CSS selectors, per URL pattern.

A profile file (TOML, path in EXTRACTION_PROFILES_FILE) looks like this:

    [[profile]]
    name = "articles"
    url_pattern = "^https?://news\\.example\\.com/"   # regular expression, searched in the URL

    [profile.fields]
    headline = { css = "h1" }                          # text of the first match
    author   = { css = "meta[name=author]", attr = "content" }
    tags     = { css = "ul.tags li", all = true }       # list of every match's text

The first profile whose pattern matches a URL applies; its fields are stored as JSONB in
pages.extracted. Every pattern and selector is compiled when the worker starts, and a bad one
stops it with one line naming the file, the line and what is wrong — a typo should not surface
as empty columns hours into a crawl.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import soupsieve
from bs4 import BeautifulSoup, Tag

from shared.errors import ConfigError

MAX_ITEMS = 200  # an `all = true` field keeps at most this many matches
MAX_TEXT_CHARS = 10_000


@dataclass(frozen=True)
class Field:
    name: str
    selector: soupsieve.SoupSieve
    attr: str | None
    all: bool


@dataclass(frozen=True)
class Profile:
    name: str
    url_pattern: re.Pattern[str]
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class Profiles:
    profiles: tuple[Profile, ...] = ()

    def for_url(self, url: str) -> Profile | None:
        return next((p for p in self.profiles if p.url_pattern.search(url)), None)

    def extract(self, url: str, soup: BeautifulSoup) -> tuple[str | None, dict[str, Any]]:
        """(profile name, extracted fields) for a parsed page; (None, {}) when none applies."""
        profile = self.for_url(url)
        if profile is None:
            return None, {}
        return profile.name, {f.name: _extract_field(f, soup) for f in profile.fields}


def _extract_field(field: Field, soup: BeautifulSoup) -> Any:
    if field.all:
        return [_value(field, tag) for tag in field.selector.select(soup, limit=MAX_ITEMS)]
    tag = field.selector.select_one(soup)
    return None if tag is None else _value(field, tag)


def _value(field: Field, tag: Tag) -> str | None:
    if field.attr is None:
        return " ".join(tag.get_text(" ").split())[:MAX_TEXT_CHARS]
    value = tag.get(field.attr)
    if isinstance(value, list):  # multi-valued attributes such as class
        value = " ".join(value)
    return None if value is None else str(value)[:MAX_TEXT_CHARS]


def load_profiles(path: str) -> Profiles:
    """Read and compile a profile file; raise ConfigError naming the file and line on any mistake."""
    if not path:
        return Profiles()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read extraction profiles ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: extraction profiles are not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    locate = _Locator(path, text)
    raw_profiles = data.get("profile", [])
    if not isinstance(raw_profiles, list) or not raw_profiles:
        raise ConfigError(f"{path}: expected one or more [[profile]] tables")
    return Profiles(tuple(_profile(entry, i, locate) for i, entry in enumerate(raw_profiles, 1)))


def _profile(entry: Any, number: int, locate: _Locator) -> Profile:
    name = entry.get("name") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{locate.path}: profile #{number} needs a name")
    pattern = entry.get("url_pattern", "")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{locate.at(name)}: profile {name!r} needs a url_pattern")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{locate.at(pattern)}: profile {name!r}: bad url_pattern: {exc}") from None
    raw_fields = entry.get("fields", {})
    if not isinstance(raw_fields, dict) or not raw_fields:
        raise ConfigError(f"{locate.at(name)}: profile {name!r} has no [profile.fields]")
    fields = tuple(_field(name, key, value, locate) for key, value in raw_fields.items())
    return Profile(name, compiled, fields)


def _field(profile: str, key: str, spec: Any, locate: _Locator) -> Field:
    where = f"profile {profile!r} field {key!r}"
    if isinstance(spec, str):
        spec = {"css": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("css"), str):
        raise ConfigError(f'{locate.at(key)}: {where}: expected {{ css = "..." }}')
    unknown = set(spec) - {"css", "attr", "all"}
    if unknown:
        raise ConfigError(f"{locate.at(key)}: {where}: unknown keys {sorted(unknown)}")
    css = spec["css"]
    try:
        selector = soupsieve.compile(css)
    except soupsieve.SelectorSyntaxError as exc:
        first_line = str(exc).splitlines()[0]
        raise ConfigError(f"{locate.at(css)}: {where}: bad CSS selector {css!r}: {first_line}") from None
    attr = spec.get("attr")
    if attr is not None and not isinstance(attr, str):
        raise ConfigError(f"{locate.at(key)}: {where}: attr must be a string")
    return Field(key, selector, attr, bool(spec.get("all", False)))


class _Locator:
    """Finds the line a value stands on, so errors name it (tomllib keeps no positions)."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def at(self, needle: str) -> str:
        for number, line in enumerate(self.lines, 1):
            if needle in line:
                return f"{self.path}:{number}"
        return self.path
