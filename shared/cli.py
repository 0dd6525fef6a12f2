"""What every entry point does the same way: logging set-up and one-line errors for user mistakes."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from shared.errors import ConfigError, ServiceUnavailable

EXIT_USER_ERROR = 2


def configure_logging(level: str, service: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # pika logs every reconnect attempt with a traceback; our own line says enough.
    logging.getLogger("pika").setLevel(logging.CRITICAL)


def run_main(service: str, main: Callable[[], int]) -> None:
    """Run `main`, turning a config mistake or an unreachable service into one line and exit 2."""
    try:
        code = main()
    except (ConfigError, ServiceUnavailable) as exc:
        print(f"{service}: error: {exc}", file=sys.stderr)
        code = EXIT_USER_ERROR
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
