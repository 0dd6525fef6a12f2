"""python -m tests.library_versions: the versions of the libraries the pipeline leans on, and
whether each fast path built on a library's private parts is on (docs/UPGRADING.md)."""

from __future__ import annotations

from shared.amqp import pika_compat
from shared.http import urllib3_compat
from shared.library_checks import version_of
from worker.parse import bs4_fastpath

LIBRARIES = ("beautifulsoup4", "lxml", "pika", "urllib3", "requests", "redis", "psycopg", "tenacity")


def main() -> None:
    for name in LIBRARIES:
        print(f"{name:15} {version_of(name) or 'not installed'}")
    checks = {
        "bs4 fast tree builder": None if bs4_fastpath.usable() else "off: see the warning above",
        "pika private parts": pika_compat.private_parts_checked(),
        "urllib3 _new_conn hook": urllib3_compat.private_path_checked(),
    }
    for part, why in checks.items():
        print(f"{part:23} {'on' if why is None else why}")


if __name__ == "__main__":
    main()
