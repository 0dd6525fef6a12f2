"""Metrics ports for the processes of one `ops.crawl` on one machine.

Every process of a crawl gets the crawl's environment, so a METRICS_PORT set for the crawl would
make all of them try the same port, and all but the first fail. Each gets a port of its own:

    dead-letter consumer   METRICS_PORT
    producer               METRICS_PORT + 1
    worker process k       METRICS_PORT + STRIDE * k (k = 1, 2, ...: the pool, or each of
                           --separate-workers), and a pool's workers the ports from it on
                           (worker/__main__.py: member n serves on its pool's port + n)

STRIDE is 10, or the size of the largest pool when that is larger, so no two ranges meet. The
producer of a crawl does not wait for a scrape after its run (METRICS_LINGER_S=0): the crawl
goes on, and the workers' figures are there to read.
"""

from __future__ import annotations

from collections.abc import Sequence

from ops.crawl_workers import WorkerLaunch
from shared.errors import ConfigError
from shared.settings import Settings

MIN_STRIDE = 10


def metrics_ports(settings: Settings, workers: Sequence[WorkerLaunch]) -> dict[str, int]:
    """Process name -> its metrics port; empty when METRICS_PORT is 0 (no metrics)."""
    base = settings.metrics_port
    if base == 0:
        return {}
    largest = max((launch.processes for launch in workers), default=1)
    stride = max(MIN_STRIDE, largest)
    ports = {"dlq_consumer": base, "producer": base + 1}
    ports.update({launch.name: base + stride * k for k, launch in enumerate(workers, start=1)})
    highest = base + stride * len(workers) + largest - 1
    if highest > 65535:
        processes = sum(launch.processes for launch in workers)
        raise ConfigError(
            f"METRICS_PORT={base}: a crawl of {processes} worker processes needs ports up to "
            f"{highest}; choose a lower METRICS_PORT (or 0 for no metrics)"
        )
    return ports


def env_for(name: str, env: dict[str, str], ports: dict[str, int]) -> dict[str, str]:
    """The environment of process `name`: the crawl's, with its own metrics port."""
    if name not in ports:
        return env
    own = {**env, "METRICS_PORT": str(ports[name])}
    if name == "producer":
        own["METRICS_LINGER_S"] = "0"
    return own


def describe(ports: dict[str, int], workers: Sequence[WorkerLaunch], host: str) -> str:
    """One line saying where each process serves /metrics."""
    processes = {launch.name: launch.processes for launch in workers}
    parts = []
    for name, port in ports.items():
        members = processes.get(name, 1)
        parts.append(f"{name} {port}-{port + members - 1}" if members > 1 else f"{name} {port}")
    return f"metrics on {host}: " + ", ".join(parts) if ports else ""
