"""What the modules that use a library's private parts ask before they do: is the installed
version one those parts were checked on? And, when they are not used, one warning saying so.

The modules: worker/parse/bs4_fastpath.py, shared/amqp/pika_compat.py, shared/http/urllib3_compat.py
(docs/UPGRADING.md lists each private use, its check and its fallback).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading

log = logging.getLogger(__name__)

Version = tuple[int, ...]

_warned: set[str] = set()
_warned_lock = threading.Lock()


def version_of(distribution: str) -> str:
    """The installed version of `distribution`, as its metadata spells it ('' when absent)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def release(version: str) -> Version:
    """'4.13.0b2' -> (4, 13, 0): the leading numbers, enough to compare with a checked range."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def outside(version: str, low: Version, below: Version) -> str | None:
    """Why `version` is not in [low, below), or None when it is."""
    if low <= release(version) < below:
        return None
    shown = ".".join(map(str, low)), ".".join(map(str, below))
    return f"version {version or 'unknown'} is outside the checked range >={shown[0]},<{shown[1]}"


def warn_fallback(part: str, why: str, instead: str) -> None:
    """Log once per process, at WARNING, that `part` is off and what is used instead."""
    with _warned_lock:
        if part in _warned:
            return
        _warned.add(part)
    log.warning("%s is off (%s): using %s", part, why, instead)
