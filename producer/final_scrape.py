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

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shared.signals import stop_signals_call

log = logging.getLogger(__name__)

RESPONSE_GRACE_S = 1.0


class ScrapeWatch(Collector):
    """The registry as the metrics server serves it, noticing each scrape: give it to
    start_metrics_server(registry=...)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._registry = registry
        self._armed = False
        self._scraped = threading.Event()
        self._wake = threading.Event()  # a scrape, or stop_waiting()

    def collect(self) -> Iterator[Metric]:
        armed = self._armed  # as the scrape starts, before any figure is read
        yield from self._registry.collect()
        if armed:
            self._scraped.set()
            self._wake.set()

    def restricted_registry(self, names: Iterable[str]) -> Collector:
        """A scrape that asks for some metrics only (`name[]=`) does not count."""
        return self._registry.restricted_registry(names)

    def arm(self) -> None:
        """From now on, a scrape that starts reads the figures as they are now, or newer: the
        first whole one of them is what wait_for_scrape() waits for."""
        self._scraped.clear()
        self._wake.clear()
        self._armed = True

    def stop_waiting(self) -> None:
        """End a wait_for_scrape() now (from a signal handler: it only sets an event)."""
        self._wake.set()

    def wait_for_scrape(self, timeout_s: float) -> bool:
        """Wait for a whole scrape that started after arm() (called here if it was not);
        False if none came within `timeout_s`."""
        if not self._armed:
            self.arm()
        try:
            self._wake.wait(timeout_s)
            return self._scraped.is_set()
        finally:
            self._armed = False


def linger_until_scraped(watch: ScrapeWatch, port: int, linger_s: float) -> bool:
    """Serve the final figures until one scrape has read them, for up to `linger_s`, or until
    SIGTERM or Ctrl-C: the run is over, so nothing is lost by going at once."""
    if linger_s <= 0:
        return False
    log.info("run over: serving the final figures on port %d until scraped (at most %.0f s)", port, linger_s)
    stopped_by: list[int] = []
    with stop_waiting_on_signals(watch, stopped_by):
        scraped = watch.wait_for_scrape(linger_s)
    if stopped_by and not scraped:
        log.info("got signal %d: not waiting for a scrape of the final figures", stopped_by[0])
    elif scraped:
        # The scrape's figures are read, but its response may still be on its way out of the
        # server's thread, which dies with the process.
        time.sleep(RESPONSE_GRACE_S)
        log.info("final figures scraped")
    else:
        log.warning("no scrape of the final figures within METRICS_LINGER_S (%.0f s)", linger_s)
    return scraped


@contextlib.contextmanager
def stop_waiting_on_signals(watch: ScrapeWatch, stopped_by: list[int]) -> Iterator[None]:
    with stop_signals_call(watch.stop_waiting, stopped_by):
        yield
