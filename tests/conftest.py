"""Fixtures shared by every test. Integration tests get names of their own (RabbitMQ namespace,
Redis prefix, PostgreSQL schema) so that tests never see each other's queues, keys or rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import management
from ops.teardown import remove_pipeline
from shared.settings import Settings

TESTS = Path(__file__).resolve().parent
# A test's kind is its folder's (the markers are declared in pyproject.toml): a test file is
# moved, not re-marked, when its kind changes. A folder of tests missing here fails collection.
FOLDER_MARKERS = {
    "unit": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "faults": "faults",
    "cluster": "cluster",
    "faults_cluster": "cluster",
    "renderer": "renderer",
    "browser": "browser",
}


def pytest_itemcollected(item: pytest.Item) -> None:
    folder = item.path.resolve().relative_to(TESTS).parts[0]
    if folder not in FOLDER_MARKERS:
        raise pytest.UsageError(
            f"tests/{folder}/ has no marker: add it to FOLDER_MARKERS in tests/conftest.py"
        )
    item.add_marker(FOLDER_MARKERS[folder])


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings() -> Iterator[Settings]:
    """Settings with unique names; everything made under them is removed afterwards."""
    name = unique_name()
    made = Settings.from_env(
        {
            "CRAWL_NAMESPACE": name,
            "REDIS_PREFIX": name,
            "PG_SCHEMA": name,
            "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/crawler_test",
            "RETRY_DELAYS_S": "0.5,1",
            "TTL_QUEUE_EXPIRY_S": "60",
            "FETCH_ALLOWLIST": "127.0.0.0/8",  # test sites are on loopback, which the guard refuses
        }
    )
    yield made
    cleanup(made)


def cleanup(settings: Settings) -> None:
    """Delete the queues, exchanges, keys and schema made under these settings' names."""
    remove_pipeline(settings)


@pytest.fixture
def management_api(settings: Settings) -> management.HttpGet:
    """A getter for the RabbitMQ management API; the test is skipped, saying why, when the API
    does not answer (`make test` enables the plugin first: tests/prepare.py)."""
    if not management.answers(settings):
        pytest.skip(
            f"the RabbitMQ management API at {settings.rabbitmq_management_url} does not answer; "
            "enable it with `rabbitmq-plugins enable rabbitmq_management` (`make test` does)"
        )
    return management.getter(settings)
