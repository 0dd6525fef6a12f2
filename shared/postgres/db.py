"""PostgreSQL connections and the schema. psycopg errors are translated here and in `translate`."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from importlib import resources

import psycopg
from psycopg import sql

from shared.errors import ConfigError, ServiceUnavailable, one_line
from shared.postgres import pooled
from shared.settings import Settings, redact

log = logging.getLogger("shared.db")  # the name operators know: kept as the module moved

START_HINT = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


def connect(settings: Settings, *, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
    """A connection whose statements find the pipeline's schema. Creates the database if missing."""
    try:
        return _connect(settings, autocommit)
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc) and "database" in str(exc):
            _create_database(settings)
            return _connect(settings, autocommit)
        raise _unavailable(settings, exc) from None


def _connect(settings: Settings, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
    if settings.database_pooler == "transaction":
        return pooled.connect(settings.database_url, settings.pg_schema, autocommit=autocommit)
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


SCHEMA_APPLIED = """
CREATE TABLE IF NOT EXISTS schema_applied (
    digest     text        PRIMARY KEY,  -- sha256 of schema.sql as applied
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def ensure_schema(settings: Settings) -> None:
    """Create or migrate the schema and tables; safe to run from every service at every start.

    A schema already at this version is left alone: ALTER TABLE takes an exclusive lock even
    when it changes nothing, and a worker starting beside busy ones would deadlock with their
    writes. Otherwise the statements run one by one, each in a transaction of its own (so no
    lock is held across tables) that first takes an advisory lock, so that two services
    starting together never run DDL side by side. The lock is a transaction's, not a session's:
    behind a transaction pooler consecutive transactions may run on different server sessions,
    and a session lock taken on one could never be released from the next. Every statement of
    schema.sql can run again (IF NOT EXISTS), so a service that finds the schema part-way
    migrated by another just runs the rest."""
    ddl = resources.files("shared.postgres").joinpath("schema.sql").read_text()
    digest = hashlib.sha256(ddl.encode()).hexdigest()
    with connect(settings, autocommit=True) as conn:
        try:
            # Under the lock too: two CREATE SCHEMA IF NOT EXISTS at once can both find it missing.
            create = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(settings.pg_schema))
            _locked(conn, settings, create)
            _locked(conn, settings, SCHEMA_APPLIED)
            if conn.execute("SELECT 1 FROM schema_applied WHERE digest = %s", (digest,)).fetchone():
                return
            for statement in _statements(ddl):
                _locked(conn, settings, statement)  # our own file
            conn.execute("INSERT INTO schema_applied (digest) VALUES (%s) ON CONFLICT DO NOTHING", (digest,))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(f"PG_SCHEMA {settings.pg_schema!r}: {exc}".strip()) from None


# What a CREATE ... IF NOT EXISTS raises when another service created the object meanwhile.
ALREADY_CREATED = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DuplicateSchema,
    psycopg.errors.DuplicateTable,
    psycopg.errors.DuplicateObject,
)


def _locked(
    conn: psycopg.Connection[tuple[object, ...]], settings: Settings, statement: str | sql.Composed
) -> None:
    """`statement` in a transaction holding the schema's advisory lock. A transaction that had
    to wait for the lock still reads the catalog as it was when it began (PostgreSQL takes in
    other sessions' catalog changes at a transaction's start and when it locks a table, not an
    advisory lock), so IF NOT EXISTS can miss what the holder created and fail on a duplicate:
    once, for the next transaction begins after the holder committed and sees it."""
    for attempt in (1, 2):
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (settings.pg_schema,))
                conn.execute(statement)  # our own file
            return
        except ALREADY_CREATED:
            if attempt == 2:
                raise


def _statements(ddl: str) -> list[str]:
    """schema.sql split into statements: at each ';' outside a $$-quoted block (a DO block's
    body holds statements of its own)."""
    lines = [line for line in ddl.splitlines() if not line.strip().startswith("--")]
    statements, current = [], ""
    for index, part in enumerate("\n".join(lines).split("$$")):
        if index % 2:  # inside $$ ... $$: kept whole
            current += f"$${part}$$"
            continue
        first, *rest = part.split(";")
        if rest:
            statements += [current + first, *rest[:-1]]
            current = rest[-1]
        else:
            current += first
    statements.append(current)
    return [s.strip() for s in statements if s.strip()]


# SQLSTATE classes that blame the data, not the database: 22 data exception (integer out of
# range, bad text, bad JSON), 23 integrity constraint violation, 54 program limit exceeded
# (index row too large). psycopg files class 54 under OperationalError, beside lost connections.
DATA_ERROR_CLASSES = frozenset({"22", "23", "54"})


def is_data_error(exc: BaseException) -> bool:
    """PostgreSQL (or psycopg, before sending) refused a row for what it holds: the same row
    fails again however often it is retried, and other rows are not affected."""
    if isinstance(exc, UnicodeEncodeError | psycopg.DataError | psycopg.IntegrityError):
        return True  # a lone surrogate cannot be sent; a NUL in text is refused before sending
    if isinstance(exc, psycopg.Error):
        return (exc.sqlstate or "")[:2] in DATA_ERROR_CLASSES
    return False


def error_line(exc: BaseException) -> str:
    """The database's message in one line, for a dead letter or a log line."""
    return one_line(exc)[:500]


@contextlib.contextmanager
def translate(settings: Settings) -> Iterator[None]:
    """Turn a lost or refused database connection into ServiceUnavailable; an error that blames
    the data (see `is_data_error`) passes through."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        if is_data_error(exc):
            raise
        raise _unavailable(settings, exc) from None


def _unavailable(settings: Settings, exc: BaseException) -> ServiceUnavailable:
    return ServiceUnavailable("PostgreSQL", redact(settings.database_url), one_line(exc), START_HINT)
