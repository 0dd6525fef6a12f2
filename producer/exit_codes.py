"""What the producer's exit code says, decided from its summary (documented in README.md).

0  every URL read was published (some sitemaps may have failed: see sitemaps_failed)
1  some publishes were never confirmed (publish_failed); a re-run with the run id retries them
2  a user mistake or a service down before anything was published (shared/cli.py)
3  no source could be read: sitemaps failed and no URL came from anywhere;
   with --strict, any failed sitemap
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

EXIT_PUBLISH_FAILED = 1
EXIT_NOTHING_READ = 3


def exit_code(summary: dict[str, Any], strict: bool = False) -> int:
    failed = summary["sitemaps_failed"]
    if summary["publish_failed"]:
        return EXIT_PUBLISH_FAILED
    if failed and summary["urls_seen"] == 0:
        log.error(
            "run %s: no sitemap could be read (%d failed), nothing to crawl", summary["run_id"], len(failed)
        )
        return EXIT_NOTHING_READ
    if failed and strict:
        log.error("run %s: %d sitemaps could not be read (--strict)", summary["run_id"], len(failed))
        return EXIT_NOTHING_READ
    if failed:
        log.warning(
            "run %s: %d sitemaps could not be read; the URLs of the others are queued",
            summary["run_id"],
            len(failed),
        )
    return 0
