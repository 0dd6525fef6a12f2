"""Keeping a finished producer's metrics up until Prometheus has read them.

A producer runs for seconds or minutes and exits; Prometheus reads it every scrape interval,
after finding it (a DNS or pod refresh). Without a wait, a short run's counts would never be
scraped. No push gateway is assumed: instead the producer, once its run is over, keeps serving
/metrics until one scrape has read the final figures, or METRICS_LINGER_S have passed.

Any whole GET of /metrics that starts after the run counts as that scrape, so nothing else
should poll the producer's metrics port (the k8s producer Job has no HTTP probes for this
reason).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

RESPONSE_GRACE_S = 1.0


class ScrapeWatch(Collector):
    """The registry as the metrics server serves it, noticing each scrape: give it to
    start_metrics_server(registry=...)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._registry = registry
        self._armed = False
        self._scraped = threading.Event()

    def collect(self) -> Iterator[Metric]:
        armed = self._armed  # as the scrape starts, before any figure is read
        yield from self._registry.collect()
        if armed:
            self._scraped.set()

    def restricted_registry(self, names: Iterable[str]) -> Collector:
        """A scrape that asks for some metrics only (`name[]=`) does not count."""
        return self._registry.restricted_registry(names)

    def arm(self) -> None:
        """From now on, a scrape that starts reads the figures as they are now, or newer: the
        first whole one of them is what wait_for_scrape() waits for."""
        self._scraped.clear()
        self._armed = True

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Wait for a whole scrape that started after arm() (called here if it was not);
        False if none came within `timeout_s`."""
        if not self._armed:
            self.arm()
        try:
            return self._scraped.wait(timeout_s)
        finally:
            self._armed = False


def linger_until_scraped(watch: ScrapeWatch, port: int, linger_s: float) -> bool:
    """Serve the final figures until one scrape has read them, for up to `linger_s`."""
    if linger_s <= 0:
        return False
    log.info("run over: serving the final figures on port %d until scraped (at most %.0f s)", port, linger_s)
    scraped = watch.wait_for_scrape(linger_s)
    if scraped:
        # The scrape's figures are read, but its response may still be on its way out of the
        # server's thread, which dies with the process.
        time.sleep(RESPONSE_GRACE_S)
        log.info("final figures scraped")
    else:
        log.warning("no scrape of the final figures within METRICS_LINGER_S (%.0f s)", linger_s)
    return scraped
