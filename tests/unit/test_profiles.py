"""Extraction profiles: loading, validation with line numbers, and extraction."""

from __future__ import annotations

from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from shared.errors import ConfigError
from worker.parse.profiles import load_profiles

GOOD = """
[[profile]]
name = "articles"
url_pattern = "/news/"

[profile.fields]
headline = { css = "h1" }
author = { css = "meta[name=author]", attr = "content" }
tags = { css = "ul.tags li", all = true }
missing = "div.nothing"
"""

PAGE = """<html><head><meta name="author" content="Ada"></head><body>
<h1>  Big   news </h1><ul class="tags"><li>one</li><li>two</li></ul></body></html>"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "profiles.toml"
    path.write_text(text)
    return str(path)


def test_the_matching_profile_extracts_every_field(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, GOOD))
    name, fields = profiles.extract("http://a.test/news/1.html", BeautifulSoup(PAGE, "lxml"))
    assert name == "articles"
    assert fields == {"headline": "Big news", "author": "Ada", "tags": ["one", "two"], "missing": None}


def test_no_profile_applies_to_other_urls(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, GOOD))
    assert profiles.extract("http://a.test/pages/1.html", BeautifulSoup(PAGE, "lxml")) == (None, {})


def test_no_file_means_no_profiles() -> None:
    assert load_profiles("").profiles == ()


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (GOOD.replace('{ css = "h1" }', '{ css = "h1[" }'), 7, "bad CSS selector 'h1['"),
        (GOOD.replace('"/news/"', '"/news/("'), 4, "bad url_pattern"),
        (GOOD.replace('attr = "content"', 'atr = "content"'), 8, "unknown keys ['atr']"),
    ],
)
def test_mistakes_name_the_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_profiles(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}:"), message
    assert fragment in message


def test_broken_toml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profiles(write(tmp_path, "[[profile]\nname="))
    with pytest.raises(ConfigError, match="cannot read"):
        load_profiles(str(tmp_path / "absent.toml"))
