"""The producer's progress on stderr while it reads and publishes: a live line on a terminal,
a line every `EVERY_S` seconds elsewhere (shared/progress.py). How many URLs the sitemaps hold is
known only once they are read, so the line counts up without a total or an ETA."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

from producer.pipeline_types import Counts
from producer.sitemaps import SitemapReader
from shared.progress import EVERY_S, ProgressDisplay

REFRESH_S = 0.5


def describe(counts: Counts, sitemaps_read: int, per_s: float) -> str:
    """e.g. "4,000 URLs read (800/s), 3,900 enqueued, 90 duplicates, 10 invalid, 3 sitemaps"."""
    return (
        f"{counts.urls_seen:,} URLs read ({per_s:,.0f}/s), {counts.enqueued_total:,} enqueued, "
        f"{counts.duplicates:,} duplicates, {sum(counts.invalid.values()):,} invalid, "
        f"{sitemaps_read} sitemaps"
        + (
            f", {counts.taken_over:,} claims taken over ({counts.republished:,} of the enqueued "
            "re-published: the broker may hold an earlier copy of each)"
            if counts.taken_over
            else ""
        )
    )


@contextlib.contextmanager
def showing_progress(
    run_id: str, counts: Counts, reader: SitemapReader, every_s: float = EVERY_S
) -> Iterator[None]:
    """While inside, a thread shows how far the run has got. It only reads the counters, which
    the pipeline's thread alone writes."""
    stop = threading.Event()
    started = time.monotonic()
    rate = {"seen": 0, "at": started, "per_s": 0.0}
    with ProgressDisplay(sys.stderr, f"run {run_id}", every_s=every_s) as display:

        def show() -> None:
            now = time.monotonic()
            if now - rate["at"] >= 1.0:
                rate["per_s"] = (counts.urls_seen - rate["seen"]) / (now - rate["at"])
                rate["seen"], rate["at"] = counts.urls_seen, now
            line = describe(counts, reader.sitemaps_read, rate["per_s"])
            display.show(counts.urls_seen, None, line, f"{line}, {now - started:.0f} s")

        def keep_showing() -> None:
            while not stop.wait(REFRESH_S):
                show()

        thread = threading.Thread(target=keep_showing, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if display.live:
                show()  # the final figures stay on the screen
