"""PostgreSQL connections and the schema. psycopg errors are translated here and in `translate`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from importlib import resources

import psycopg
from psycopg import sql

from shared.errors import ConfigError, ServiceUnavailable
from shared.settings import Settings, redact

log = logging.getLogger(__name__)

START_HINT = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def connect(settings: Settings, *, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
    """A connection whose search_path is the pipeline's schema. Creates the database if missing."""
    try:
        return _connect(settings, autocommit)
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc) and "database" in str(exc):
            _create_database(settings)
            return _connect(settings, autocommit)
        raise _unavailable(settings, exc) from None


def _connect(settings: Settings, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        settings.database_url,
        autocommit=autocommit,
        connect_timeout=5,
        options=f"-c search_path={settings.pg_schema}",
    )


def _create_database(settings: Settings) -> None:
    info = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    name = str(info.get("dbname", ""))
    admin_url = psycopg.conninfo.make_conninfo(settings.database_url, dbname="postgres")
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log.info("created database %s", name)
    except psycopg.errors.DuplicateDatabase:
        pass  # another service created it first
    except psycopg.Error as exc:
        raise _unavailable(settings, exc) from None


def ensure_schema(settings: Settings) -> None:
    """Create the schema and tables if they are not there yet; safe to run from every service."""
    ddl = resources.files("shared").joinpath("schema.sql").read_text()
    with connect(settings, autocommit=True) as conn:
        try:
            # Serialise concurrent starts: CREATE ... IF NOT EXISTS is not race-free in PostgreSQL.
            conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (settings.pg_schema,))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(settings.pg_schema)))
            conn.execute(ddl)  # a trusted file of our own
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (settings.pg_schema,))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(f"PG_SCHEMA {settings.pg_schema!r}: {exc}".strip()) from None


@contextlib.contextmanager
def translate(settings: Settings) -> Iterator[None]:
    """Turn a lost or refused database connection into ServiceUnavailable."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise _unavailable(settings, exc) from None


def _unavailable(settings: Settings, exc: BaseException) -> ServiceUnavailable:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    return ServiceUnavailable("PostgreSQL", redact(settings.database_url), detail, START_HINT)
