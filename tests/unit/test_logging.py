"""The JSON log format: one parseable object per line, with the context a call passes."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from shared.cli import JsonFormatter, configure_logging
from shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines to a buffer (the root logger stays untouched)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter("worker", worker_id="host-42"))
    logger = logging.getLogger("tests.json_logging")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, buffer
    logger.removeHandler(handler)


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_a_line_has_the_standard_fields_and_the_context(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buffer = logged

    logger.info(
        "stored %s status=%d", "https://a.example/", 200, extra={"run_id": "r1", "url": "https://a.example/"}
    )

    [entry] = lines(buffer)
    assert entry.pop("ts").endswith("+00:00")
    assert entry == {
        "level": "INFO",
        "service": "worker",
        "logger": "tests.json_logging",
        "message": "stored https://a.example/ status=200",
        "worker_id": "host-42",
        "run_id": "r1",
        "url": "https://a.example/",
    }


def test_the_timestamp_is_the_records_time_in_utc(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buffer = logged
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "late", (), None)
    record.created = 1_795_000_000.25  # 2026-11-18T11:06:40.250Z

    logger.handle(record)

    [entry] = lines(buffer)
    assert datetime.fromisoformat(entry["ts"]).timestamp() == 1_795_000_000.25
    assert entry["ts"] == "2026-11-18T11:06:40.250+00:00"
    assert entry["level"] == "WARNING"


def test_context_passed_with_a_call_overrides_the_process_worker_id(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buffer = logged

    logger.info("replayed", extra={"worker_id": "other"})
    logger.info("no context")

    first, second = lines(buffer)
    assert first["worker_id"] == "other"
    assert second["worker_id"] == "host-42"
    assert "run_id" not in second and "url" not in second


def test_a_traceback_stays_on_one_line(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buffer = logged
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("failed on %s", "https://a.example/")

    assert len(buffer.getvalue().splitlines()) == 1
    [entry] = lines(buffer)
    assert entry["message"] == "failed on https://a.example/"
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("ValueError: bad\nvalue")


def test_non_ascii_is_kept_readable(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buffer = logged

    logger.info("title %s", "Über ✓")

    assert "Über ✓" in buffer.getvalue()
    assert lines(buffer)[0]["message"] == "title Über ✓"


def configured_process(fmt: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: configure_logging sets up the root logger, which tests must not touch."""
    code = (
        "import logging; from shared.cli import configure_logging; "
        f"configure_logging('info', 'producer', {fmt!r}, 'w-1'); "
        "log = logging.getLogger('producer.pipeline'); "
        "log.debug('hidden'); log.info('enqueued %d', 5, extra={'run_id': 'r9'})"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
    )


def test_configure_logging_json_writes_json_lines_to_stderr() -> None:
    done = configured_process("json")

    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    entry = json.loads(line)
    assert (entry["service"], entry["logger"], entry["message"]) == (
        "producer",
        "producer.pipeline",
        "enqueued 5",
    )
    assert (entry["run_id"], entry["worker_id"]) == ("r9", "w-1")


def test_configure_logging_text_keeps_the_plain_line() -> None:
    done = configured_process("text")

    [line] = done.stderr.splitlines()
    # The worker id names the process on text lines too.
    assert line.endswith(" INFO producer[w-1] producer.pipeline: enqueued 5")


def test_an_unknown_format_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="LOG_FORMAT"):
        configure_logging("INFO", "status", "xml")
