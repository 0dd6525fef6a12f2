"""A finished producer keeps serving its metrics until one scrape has read the final figures."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from producer.final_scrape import ScrapeWatch, linger_until_scraped
from shared import metrics
from shared.settings import Settings
from tests.ports import free_port


@dataclasses.dataclass
class Served:
    port: int
    watch: ScrapeWatch
    urls: Counter

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            text: str = response.read().decode("utf-8")
            return text


@pytest.fixture
def served() -> Iterator[Served]:
    registry = CollectorRegistry()
    urls = Counter("test_urls", "URLs.", registry=registry)
    watch = ScrapeWatch(registry)
    port = free_port()
    settings = dataclasses.replace(Settings(), metrics_port=port, metrics_host="127.0.0.1")
    server = metrics.start_metrics_server(settings, registry=watch)
    assert server is not None
    yield Served(port, watch, urls)
    server.shutdown()
    server.server_close()


def test_the_wrapped_registry_is_what_is_served(served: Served) -> None:
    served.urls.inc(3)
    assert "test_urls_total 3.0" in served.scrape()


def test_a_scrape_after_the_run_ends_the_wait_and_reads_the_final_count(served: Served) -> None:
    served.urls.inc(7)  # the run's last count, before the wait starts
    texts: list[str] = []
    scraper = threading.Timer(0.2, lambda: texts.append(served.scrape()))
    scraper.start()

    assert served.watch.wait_for_scrape(30.0) is True
    scraper.join()
    assert "test_urls_total 7.0" in texts[0]


def test_scrapes_before_the_wait_do_not_count(served: Served) -> None:
    served.scrape()
    served.scrape()

    assert served.watch.wait_for_scrape(0.05) is False


def test_a_scrape_between_arming_and_waiting_counts(served: Served) -> None:
    served.watch.arm()
    served.scrape()

    assert served.watch.wait_for_scrape(0.05) is True


def test_no_linger_when_it_is_set_to_0(served: Served) -> None:
    assert linger_until_scraped(served.watch, served.port, 0.0) is False


def test_stop_waiting_ends_the_wait_without_counting_as_a_scrape(served: Served) -> None:
    served.watch.arm()
    threading.Timer(0.2, served.watch.stop_waiting).start()
    assert served.watch.wait_for_scrape(60) is False


def test_sigterm_during_the_linger_ends_it(served: Served) -> None:
    before = signal.getsignal(signal.SIGTERM)
    served.watch.arm()
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    assert linger_until_scraped(served.watch, served.port, 60) is False
    assert signal.getsignal(signal.SIGTERM) == before  # the handler was only for the wait
