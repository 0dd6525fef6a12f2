"""Fixtures of the topology tests: each needs its topology started first (`make pgbouncer-up`),
and is skipped, saying so, when it is not. `make test` and a bare `pytest` never run them
(pyproject.toml); `make test-pgbouncer` does."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.pgbouncer import drop_database
from shared.errors import one_line
from shared.settings import Settings
from tests.e2e.conftest import demo_site as demo_site  # the same local site as the e2e tests

PGBOUNCER_PORT = int(os.environ.get("PGBOUNCER_PORT", "6432"))
# A database of their own: every backend PostgreSQL holds for it is one of PgBouncer's. Named
# for this run, and dropped when it ends (pooled_database).
DATABASE = f"crawler_pooled_test_{uuid.uuid4().hex[:8]}"
DIRECT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PGBOUNCER_ADMIN_URL = f"postgresql://postgres@127.0.0.1:{PGBOUNCER_PORT}/pgbouncer"


def pgbouncer_show(what: str) -> list[dict[str, Any]]:
    """A SHOW command of PgBouncer's admin console, as rows of named columns."""
    with psycopg.connect(PGBOUNCER_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
        cur = conn.execute(f"SHOW {what}")
        names = [column.name for column in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


@pytest.fixture(scope="session")
def pgbouncer() -> dict[str, str]:
    """PgBouncer's configuration, once it answers on 127.0.0.1:PGBOUNCER_PORT."""
    try:
        config = {str(row["key"]): str(row["value"]) for row in pgbouncer_show("CONFIG")}
    except psycopg.OperationalError as exc:
        pytest.skip(
            f"no PgBouncer on 127.0.0.1:{PGBOUNCER_PORT} ({one_line(exc)}); start it with `make pgbouncer-up`"
        )
    assert config["pool_mode"] == "transaction", "these tests are about transaction pooling"
    return config


@pytest.fixture(scope="session")
def pooled_database(pgbouncer: dict[str, str]) -> Iterator[str]:
    """DATABASE, made before the first test through PgBouncer and dropped after the last, with
    the schemas the tests made in it."""
    with psycopg.connect(DIRECT_ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    yield DATABASE
    drop_database(DATABASE)


@pytest.fixture
def pooled(settings: Settings, pooled_database: str) -> Settings:
    """The test's unique names, reaching PostgreSQL through PgBouncer."""
    return dataclasses.replace(
        settings,
        database_url=f"postgresql://postgres@127.0.0.1:{PGBOUNCER_PORT}/{pooled_database}",
        database_pooler="transaction",
    )
