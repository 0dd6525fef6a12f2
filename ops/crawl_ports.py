"""Metrics ports for the processes of one `ops.crawl` on one machine.

Every process of a crawl gets the crawl's environment, so a METRICS_PORT set for the crawl would
make all of them try the same port, and all but the first fail. Each gets a port of its own:

    dead-letter consumer   METRICS_PORT
    producer               METRICS_PORT + 1
    worker k (1, 2, ...)   METRICS_PORT + STRIDE * k, and its pool's processes the ports after
                           it (worker/__main__.py: member n serves on its worker's port + n)

STRIDE is 10, or WORKER_PROCESSES when a pool is larger, so no two ranges meet. The producer of
a crawl does not wait for a scrape after its run (METRICS_LINGER_S=0): the crawl goes on, and
the workers' figures are there to read.
"""

from __future__ import annotations

from shared.errors import ConfigError
from shared.settings import Settings

MIN_STRIDE = 10


def metrics_ports(settings: Settings, workers: int) -> dict[str, int]:
    """Process name -> its metrics port; empty when METRICS_PORT is 0 (no metrics)."""
    base = settings.metrics_port
    if base == 0:
        return {}
    stride = max(MIN_STRIDE, settings.worker_processes)
    ports = {"dlq_consumer": base, "producer": base + 1}
    ports.update({f"worker-{k}": base + stride * k for k in range(1, workers + 1)})
    highest = base + stride * workers + settings.worker_processes - 1
    if highest > 65535:
        raise ConfigError(
            f"METRICS_PORT={base}: a crawl of {workers} workers needs ports up to {highest}; "
            f"choose a lower METRICS_PORT (or 0 for no metrics)"
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


def describe(ports: dict[str, int], worker_processes: int, host: str) -> str:
    """One line saying where each process serves /metrics."""
    parts = []
    for name, port in ports.items():
        if name.startswith("worker-") and worker_processes > 1:
            parts.append(f"{name} {port}-{port + worker_processes - 1}")
        else:
            parts.append(f"{name} {port}")
    return f"metrics on {host}: " + ", ".join(parts) if ports else ""
