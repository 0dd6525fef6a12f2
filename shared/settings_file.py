"""CRAWL_SETTINGS_FILE: the settings as a TOML file, under the names of their environment
variables, which still win over it.

    # crawl.toml
    RATE_LIMIT_RPS = 1.5
    RETRY_DELAYS_S = [5, 30, 120]
    RESPECT_ROBOTS = true

Each value is turned back into the text an environment variable would hold (a list joined by
commas, a boolean as true/false) and goes through the same parsing and validation, so a value
is refused in the same words wherever it comes from; a mistake in the file is named by the
file and the key (``crawl.toml: RATE_LIMIT_RPS: must be positive, got 0.0``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection

from shared.errors import ConfigError

FILE_VARIABLE = "CRAWL_SETTINGS_FILE"
MAX_SETTINGS_FILE_BYTES = 1024 * 1024


def read_settings_file(path: str, names: Collection[str]) -> dict[str, str]:
    """The file's settings by variable name (upper case), as environment-variable text.
    `names` are the variables a setting reads; any other key is a mistake."""
    if not os.path.isfile(path):
        raise ConfigError(f"{FILE_VARIABLE}: {path!r} is not a file")
    if os.path.getsize(path) > MAX_SETTINGS_FILE_BYTES:
        raise ConfigError(f"{FILE_VARIABLE}: {path!r} is over {MAX_SETTINGS_FILE_BYTES} bytes")
    try:
        with open(path, encoding="utf-8") as file:
            table = tomllib.loads(file.read())
    except OSError as exc:
        raise ConfigError(f"{FILE_VARIABLE}: cannot read {path!r} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{FILE_VARIABLE}: {path!r} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{FILE_VARIABLE}: {path!r} is not valid TOML ({exc})") from None
    values: dict[str, str] = {}
    for key, value in table.items():
        name = key.upper()
        if name == FILE_VARIABLE or name not in names:
            raise ConfigError(f"{path}: {key}: no such setting (the names are those of .env.example)")
        if name in values:
            raise ConfigError(f"{path}: {key}: set twice (names are read in any case)")
        values[name] = _as_text(path, key, value)
    return values


def _as_text(path: str, key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return ",".join(str(item) for item in value)
    raise ConfigError(f"{path}: {key}: expected a string, a number, a boolean or a list of them")


def blamed_on_file(error: ConfigError, path: str, from_file: Collection[str]) -> ConfigError:
    """A validation error about a variable whose value came from the file, naming the file too."""
    message = str(error)
    name = message.split(":", 1)[0]
    if path and name in from_file:
        return ConfigError(f"{path}: {message}")
    return error
