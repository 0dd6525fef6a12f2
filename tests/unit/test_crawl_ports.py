"""The metrics ports of a crawl's processes: one each, never shared, the producer not lingering."""

from __future__ import annotations

import dataclasses

import pytest

from ops.crawl_ports import describe, env_for, metrics_ports
from ops.crawl_workers import WorkerLaunch, worker_launches
from shared.errors import ConfigError
from shared.settings import Settings

METRICS = dataclasses.replace(Settings(), metrics_port=9100)


def served_ports(ports: dict[str, int], workers: list[WorkerLaunch]) -> list[int]:
    """Every port a process of the crawl listens on, a worker pool's members included."""
    members = {launch.name: launch.processes for launch in workers}
    return [port + n for name, port in ports.items() for n in range(members.get(name, 1))]


@pytest.mark.parametrize(
    "workers",
    [
        worker_launches(1),
        worker_launches(4),
        worker_launches(25),
        worker_launches(3, separate=True),
        worker_launches(4, 4, separate=True),
        worker_launches(3, 10, separate=True),
        worker_launches(2, 25, separate=True),
    ],
)
def test_no_two_processes_share_a_port(workers: list[WorkerLaunch]) -> None:
    ports = metrics_ports(METRICS, workers)
    assert ports["dlq_consumer"] == 9100 and ports["producer"] == 9101
    assert len(ports) == len(workers) + 2
    served = served_ports(ports, workers)
    assert len(served) == len(set(served)) == sum(launch.processes for launch in workers) + 2


def test_a_pool_s_workers_serve_the_ports_from_the_pool_s_on() -> None:
    pool = worker_launches(4)
    ports = metrics_ports(METRICS, pool)
    assert ports == {"dlq_consumer": 9100, "producer": 9101, "worker-pool": 9110}
    assert describe(ports, pool, "127.0.0.1") == (
        "metrics on 127.0.0.1: dlq_consumer 9100, producer 9101, worker-pool 9110-9113"
    )


def test_each_process_gets_its_own_port_and_the_producer_does_not_wait_for_a_scrape() -> None:
    separate = worker_launches(2, separate=True)
    ports = metrics_ports(METRICS, separate)
    env = {"METRICS_PORT": "9100", "METRICS_LINGER_S": "60", "OTHER": "x"}
    assert env_for("worker-2", env, ports) == {**env, "METRICS_PORT": "9120"}
    assert env_for("producer", env, ports) == {**env, "METRICS_PORT": "9101", "METRICS_LINGER_S": "0"}
    assert env == {"METRICS_PORT": "9100", "METRICS_LINGER_S": "60", "OTHER": "x"}  # not changed
    assert describe(ports, separate, "127.0.0.1") == (
        "metrics on 127.0.0.1: dlq_consumer 9100, producer 9101, worker-1 9110, worker-2 9120"
    )


def test_no_metrics_port_means_no_ports_and_the_crawl_s_environment() -> None:
    assert metrics_ports(Settings(), worker_launches(3)) == {}
    assert env_for("producer", {"A": "1"}, {}) == {"A": "1"}


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        (worker_launches(4, separate=True), "a crawl of 4 worker processes needs ports up to 65540"),
        (worker_launches(40), "a crawl of 40 worker processes needs ports up to 65579"),
    ],
)
def test_a_port_range_past_65535_is_a_config_error(workers: list[WorkerLaunch], message: str) -> None:
    with pytest.raises(ConfigError, match=f"METRICS_PORT=65500: {message}"):
        metrics_ports(dataclasses.replace(Settings(), metrics_port=65500), workers)
