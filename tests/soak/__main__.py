"""python -m tests.soak: one soak, configured by SOAK_MINUTES, SOAK_SEED, SOAK_URLS,
SOAK_PORT_BASE, SOAK_DRAIN_MINUTES and SOAK_DIR (docs/RELIABILITY.md, "The soak"); exits 1 when
the checker finds a failure."""

from __future__ import annotations

import os
import sys

from tests.soak.soak import Soak, options_from_env


def main() -> int:
    return Soak(options_from_env(dict(os.environ))).run()


if __name__ == "__main__":
    sys.exit(main())
