"""The metrics endpoint, and the dead-letter consumer's count of recorded dead letters."""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dlq_consumer.service import DeadLetterRecorder
from shared import metrics
from shared.consumer import Delivery
from shared.errors import ConfigError, ServiceUnavailable
from shared.messages import CrawlTask, Failure
from shared.settings import Settings
from tests.fakes import FakeDeadLetterConnection
from tests.ports import free_port


def on_port(port: int) -> Settings:
    return dataclasses.replace(Settings(), metrics_port=port, metrics_host="127.0.0.1")


@pytest.fixture
def served() -> Iterator[int]:
    port = free_port()
    server = metrics.start_metrics_server(on_port(port))
    assert server is not None
    yield port
    server.shutdown()
    server.server_close()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode("utf-8")
        return text


def test_port_0_starts_no_server() -> None:
    assert metrics.start_metrics_server(on_port(0)) is None


def test_the_endpoint_serves_the_pipeline_metrics(served: int) -> None:
    metrics.HTTP_RESPONSES.labels("503").inc(2)
    metrics.FETCH_SECONDS.observe(0.3)

    text = scrape(served)

    assert "# TYPE crawl_pages_stored_total counter" in text
    assert "# TYPE crawl_fetch_duration_seconds histogram" in text
    assert "# TYPE crawl_fetches_in_flight gauge" in text
    assert "# TYPE crawl_producer_urls_enqueued_total counter" in text
    assert 'crawl_http_responses_total{code="503"}' in text
    assert 'crawl_fetch_duration_seconds_bucket{le="0.5"}' in text


def test_a_port_in_use_is_a_config_error_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match=re.escape("METRICS_PORT: cannot listen on 127.0.0.1:")):
            metrics.start_metrics_server(on_port(taken.getsockname()[1]))


def wakes_of(thread: threading.Thread) -> int:
    """How many times the thread has gone to sleep and been woken (Linux)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_the_server_thread_sleeps_until_a_scrape_or_the_shutdown() -> None:
    server = metrics.start_metrics_server(on_port(free_port()))
    assert server is not None
    port = server.server_address[1]
    [thread] = [t for t in threading.enumerate() if t.name == "metrics-server"]
    try:
        scrape(port)
        time.sleep(0.1)  # the request's thread is done with the server's socket
        before = wakes_of(thread)
        time.sleep(1.2)  # serve_forever's own loop would have woken twice
        assert wakes_of(thread) == before
        assert "crawl_pages_stored_total" in scrape(port)
    finally:
        started = time.monotonic()
        server.shutdown()
        server.server_close()
    assert time.monotonic() - started < 1.0 and not thread.is_alive()


def dead_letters_counted(reason: str) -> float:
    return REGISTRY.get_sample_value("crawl_dead_letters_total", {"reason": reason}) or 0.0


def dead_letter(reason: str) -> Delivery:
    body = CrawlTask(url="https://a.example/x", run_id="r", queue="bulk").encode()
    return Delivery("dead", body, Failure(reason).to_headers(), redelivered=False)


def test_a_recorded_dead_letter_is_counted_by_its_reason() -> None:
    before = (dead_letters_counted("http_410"), dead_letters_counted("timeout"))
    recorder = DeadLetterRecorder(Settings(), connect=lambda _settings: FakeDeadLetterConnection())

    recorder(dead_letter("http_410"))
    recorder(dead_letter("http_410"))
    recorder(dead_letter("timeout"))

    after = (dead_letters_counted("http_410"), dead_letters_counted("timeout"))
    assert (after[0] - before[0], after[1] - before[1]) == (2.0, 1.0)


def test_a_dead_letter_whose_row_was_not_committed_is_not_counted() -> None:
    before = dead_letters_counted("http_418")
    recorder = DeadLetterRecorder(
        Settings(), connect=lambda _settings: FakeDeadLetterConnection(fail_commit=True)
    )

    with pytest.raises(ServiceUnavailable):
        recorder(dead_letter("http_418"))

    assert dead_letters_counted("http_418") == before
