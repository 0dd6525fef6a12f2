"""Fixtures of the cluster scenarios: this test's names on the local three-node cluster, with
quorum queues; the site, fleet and figures of the fault scenarios. `make faults-cluster` brings
the cluster up first and takes it down after."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops.teardown import remove_pipeline
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.faults.conftest import FAULT_ENV, FIGURES_DIR, fleet, pytest_terminal_summary, report, site, size
from tests.faults_cluster.cluster import cluster_url

__all__ = ["fleet", "pytest_terminal_summary", "report", "site", "size"]


@pytest.fixture
def settings(settings: Settings) -> Iterator[Settings]:
    """The test's unique names, on the cluster's three nodes, with quorum queues."""
    url = cluster_url()
    if not url:
        pytest.skip("the local RabbitMQ cluster is not up: run `make faults-cluster`")
    clustered = dataclasses.replace(settings, amqp_url=url, queue_type="quorum")
    yield clustered
    remove_pipeline(clustered)


@pytest.fixture
def env(settings: Settings) -> Callable[..., dict[str, str]]:
    def make(**overrides: str) -> dict[str, str]:
        cluster = {"AMQP_URL": settings.amqp_url, "QUEUE_TYPE": "quorum"}
        return service_env(settings, **{**FAULT_ENV, **cluster, **overrides})

    return make


@pytest.fixture(autouse=True)
def logs_kept(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    """Each scenario's service logs, kept in var/faults/cluster-logs whatever the outcome: the
    timeline of an outage is read from them, and pytest's own temporary directories rotate."""
    yield
    if any(tmp_path.glob("logs-*")):
        kept = FIGURES_DIR / "cluster-logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{request.node.name}"
        shutil.copytree(tmp_path, kept, dirs_exist_ok=True)
