"""The log of a URL's handling: the one logger its lines go to, whichever worker module writes
them, and the fields those lines carry for the URL. The handling is spread over several modules
(worker/handler.py and the ones it hands parts of the work to), but its lines keep the logger
name they have always had, `worker.handler`: every line shows it (the JSON lines' `logger`
field, docs/OPERATING.md), and a search of the logs may select on it.
"""

from __future__ import annotations

import logging

from shared.messages import CrawlTask

log = logging.getLogger("worker.handler")  # the name operators know: kept as the module moved


def log_context(task: CrawlTask) -> dict[str, str]:
    """Fields JSON log lines carry for a URL (shared.cli.JsonFormatter)."""
    return {"run_id": task.run_id, "url": task.url}
