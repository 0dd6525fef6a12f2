"""What every entry point does the same way: logging set-up and one-line errors for user mistakes."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from shared.errors import ConfigError, ServiceUnavailable

EXIT_USER_ERROR = 2
LOG_FORMATS = ("text", "json")
# Context a log call may pass with `extra={...}`; the JSON format gives each a field of its own
# so that a log collector can filter on it.
CONTEXT_FIELDS = ("run_id", "worker_id", "url")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, service, logger, message, and any context fields."""

    def __init__(self, service: str, worker_id: str = "") -> None:
        super().__init__()
        self._service = service
        self._worker_id = worker_id

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._worker_id:
            entry["worker_id"] = self._worker_id
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes newlines, so a traceback still takes one line.
        return json.dumps(entry, ensure_ascii=False, separators=(",", ":"))


def configure_logging(level: str, service: str, fmt: str = "text", worker_id: str = "") -> None:
    """Log to stderr as text lines (`fmt="text"`) or JSON lines (`fmt="json"`, see JsonFormatter).

    `worker_id` goes into every JSON line, so lines from many worker processes can be told apart."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"LOG_FORMAT: expected 'text' or 'json', got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service, worker_id))
    else:
        who = f"{service}[{worker_id}]" if worker_id else service
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {who} %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # pika logs every reconnect attempt with a traceback; our own line says enough.
    logging.getLogger("pika").setLevel(logging.CRITICAL)


def run_main(service: str, main: Callable[[], int]) -> None:
    """Run `main`, turning a config mistake or an unreachable service into one line and exit 2."""
    sys.exit(exit_code_of(service, main))


def exit_code_of(service: str, main: Callable[[], int]) -> int:
    """What run_main exits with, returned instead (for a forked worker, which must not unwind)."""
    try:
        return main()
    except (ConfigError, ServiceUnavailable) as exc:
        print(f"{service}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
