"""python -m tests.soak: one soak, configured by SOAK_MINUTES, SOAK_SEED, SOAK_URLS,
SOAK_PORT_BASE, SOAK_DRAIN_MINUTES and SOAK_DIR (docs/RELIABILITY.md, "The soak"); exits 1 when
the checker finds a failure."""

from __future__ import annotations

import os
import signal
import sys

from tests.soak.load import plan
from tests.soak.schedule import draw
from tests.soak.soak import Soak, options_from_env


def _stop(signum: int, _frame: object) -> None:
    # SystemExit unwinds the main thread through the soak's clean-up; the default SIGTERM
    # would leave its processes and services running.
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    options = options_from_env(dict(os.environ))
    try:
        plan(options.seed, options.urls, options.window_s)  # a size that cannot be run: one line
        draw(options.seed, options.window_s)
    except ValueError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    return Soak(options).run()


if __name__ == "__main__":
    sys.exit(main())
