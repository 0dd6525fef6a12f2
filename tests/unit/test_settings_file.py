"""CRAWL_SETTINGS_FILE: the same names and checks as the environment, which wins over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.settings import Settings


def settings_from(tmp_path: Path, text: str, **env: str) -> Settings:
    path = tmp_path / "crawl.toml"
    path.write_text(text, encoding="utf-8")
    return Settings.from_env({"CRAWL_SETTINGS_FILE": str(path), **env})


def test_file_values_are_read_under_the_variables_names(tmp_path: Path) -> None:
    settings = settings_from(
        tmp_path,
        "RATE_LIMIT_RPS = 1.5\nretry_delays_s = [5, 30, 120]\nRESPECT_ROBOTS = false\n"
        'MAX_ATTEMPTS = 4\nUSER_AGENT = "bot/1"\n',
    )
    assert settings.rate_limit_rps == 1.5
    assert settings.retry_delays_s == (5.0, 30.0, 120.0)
    assert settings.respect_robots is False
    assert settings.max_attempts == 4
    assert settings.user_agent == "bot/1"


def test_the_environment_wins_over_the_file(tmp_path: Path) -> None:
    settings = settings_from(tmp_path, "RATE_LIMIT_RPS = 1.5\nMAX_ATTEMPTS = 4\n", RATE_LIMIT_RPS="7")
    assert settings.rate_limit_rps == 7.0
    assert settings.max_attempts == 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("RATE_LIMIT_RPS = 0\n", "crawl.toml: RATE_LIMIT_RPS: must be positive, got 0.0"),
        ('RATE_LIMIT_RPS = "fast"\n', "crawl.toml: RATE_LIMIT_RPS: expected float, got 'fast'"),
        ('QUEUE_TYPE = "stream"\n', "crawl.toml: QUEUE_TYPE: expected 'classic' or 'quorum', got 'stream'"),
        ("RATE_LIMT_RPS = 2\n", "crawl.toml: RATE_LIMT_RPS: no such setting"),
        ("USER_AGENT = {a = 1}\n", "crawl.toml: USER_AGENT: expected a string, a number"),
        ("RATE_LIMIT_RPS = \n", "is not valid TOML"),
    ],
)
def test_a_mistake_in_the_file_names_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message
    assert expected in message
    assert str(tmp_path / "crawl.toml") in message


def test_a_mistake_in_the_environment_names_only_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from(tmp_path, "MAX_ATTEMPTS = 4\n", RATE_LIMIT_RPS="0")
    assert str(caught.value) == "RATE_LIMIT_RPS: must be positive, got 0.0"


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^CRAWL_SETTINGS_FILE: '.*nowhere.toml' is not a file$"):
        Settings.from_env({"CRAWL_SETTINGS_FILE": str(tmp_path / "nowhere.toml")})


def test_credentials_in_the_file_stay_out_of_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from(tmp_path, 'DATABASE_URL = "mysql://u:s3cret@127.0.0.1/db"\n')
    assert "s3cret" not in str(caught.value)
    assert "crawl.toml: DATABASE_URL" in str(caught.value)
