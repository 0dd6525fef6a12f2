"""The metrics ports of a crawl's processes: one each, never shared, the producer not lingering."""

from __future__ import annotations

import dataclasses

import pytest

from ops.crawl_ports import describe, env_for, metrics_ports
from shared.errors import ConfigError
from shared.settings import Settings

pytestmark = pytest.mark.unit


def served_ports(ports: dict[str, int], worker_processes: int) -> list[int]:
    """Every port a process of the crawl listens on, a worker pool's members included."""
    served: list[int] = []
    for name, port in ports.items():
        members = worker_processes if name.startswith("worker-") else 1
        served.extend(port + n for n in range(members))
    return served


@pytest.mark.parametrize(("workers", "worker_processes"), [(1, 1), (3, 1), (4, 4), (3, 10), (2, 25)])
def test_no_two_processes_share_a_port(workers: int, worker_processes: int) -> None:
    settings = dataclasses.replace(Settings(), metrics_port=9100, worker_processes=worker_processes)
    ports = metrics_ports(settings, workers)
    assert ports["dlq_consumer"] == 9100 and ports["producer"] == 9101
    assert len(ports) == workers + 2
    served = served_ports(ports, worker_processes)
    assert len(served) == len(set(served)) == workers * worker_processes + 2


def test_each_process_gets_its_own_port_and_the_producer_does_not_wait_for_a_scrape() -> None:
    settings = dataclasses.replace(Settings(), metrics_port=9100)
    ports = metrics_ports(settings, 2)
    env = {"METRICS_PORT": "9100", "METRICS_LINGER_S": "60", "OTHER": "x"}
    assert env_for("worker-2", env, ports) == {**env, "METRICS_PORT": "9120"}
    assert env_for("producer", env, ports) == {**env, "METRICS_PORT": "9101", "METRICS_LINGER_S": "0"}
    assert env == {"METRICS_PORT": "9100", "METRICS_LINGER_S": "60", "OTHER": "x"}  # not changed
    assert describe(ports, 1, "127.0.0.1") == (
        "metrics on 127.0.0.1: dlq_consumer 9100, producer 9101, worker-1 9110, worker-2 9120"
    )


def test_no_metrics_port_means_no_ports_and_the_crawl_s_environment() -> None:
    assert metrics_ports(Settings(), 3) == {}
    assert env_for("producer", {"A": "1"}, {}) == {"A": "1"}


def test_a_port_range_past_65535_is_a_config_error() -> None:
    settings = dataclasses.replace(Settings(), metrics_port=65500)
    with pytest.raises(ConfigError, match="METRICS_PORT=65500: a crawl of 4 workers needs ports up to 65540"):
        metrics_ports(settings, 4)
