"""PostgreSQL connections through a transaction pooler (PgBouncer with pool_mode=transaction).

Such a pooler lends a server session to a client for one transaction at a time; the next
transaction of the same client may run on another session. Nothing a session remembers can be
relied on between transactions, and two things we otherwise rely on are session state:

- Prepared statements. psycopg prepares a query it has run five times, on the session of the
  moment; PgBouncer before 1.21 (Debian bookworm has 1.18) does not carry them across sessions,
  so the sixth run fails with "prepared statement ... does not exist". Connections here never
  prepare (`prepare_threshold=None`). Pipeline mode, which executemany uses, needs no session
  state and works unchanged.
- The search_path naming the pipeline's schema, which a direct connection sets once in its
  startup `options`. PgBouncer 1.18 refuses that startup parameter (or, told to ignore it, drops
  it). Here every cursor sets the schema with `set_config(..., is_local => true)` inside the
  transaction its statement runs in; a statement on an autocommit connection is wrapped in a
  transaction of its own for that. It costs one more statement per statement, on the same
  round trip budget a pooler is chosen for.

Advisory locks (`db.ensure_schema`) are likewise taken per transaction, never per session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.abc import Params, Query, QueryNoTemplate

SET_SCHEMA = "SELECT set_config('search_path', %s, true)"


class PooledConnection(psycopg.Connection[tuple[object, ...]]):
    """A connection that knows the schema its every transaction must find first."""

    schema: str = "public"


def connect(url: str, schema: str, *, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
    conn = PooledConnection.connect(
        url,
        autocommit=autocommit,
        connect_timeout=5,
        prepare_threshold=None,
        cursor_factory=SchemaCursor,
    )
    conn.schema = schema
    conn.server_cursor_factory = SchemaServerCursor
    return conn


def _schema(conn: psycopg.Connection[Any]) -> str:
    return conn.schema if isinstance(conn, PooledConnection) else "public"


def _outside_transaction(conn: psycopg.Connection[Any]) -> bool:
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


class SchemaCursor(psycopg.Cursor[Any]):
    """A cursor whose statements run in a transaction that has set the schema."""

    def execute(  # type: ignore[override]  # the overloads come down to these two
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> SchemaCursor:
        if _outside_transaction(self.connection):
            with self.connection.transaction():
                super().execute(SET_SCHEMA, (_schema(self.connection),))
                return super().execute(query, params, prepare=prepare, binary=binary)
        super().execute(SET_SCHEMA, (_schema(self.connection),))
        return super().execute(query, params, prepare=prepare, binary=binary)

    def executemany(self, query: Query, params_seq: Iterable[Params], *, returning: bool = False) -> None:
        if _outside_transaction(self.connection):
            with self.connection.transaction():
                super().execute(SET_SCHEMA, (_schema(self.connection),))
                super().executemany(query, params_seq, returning=returning)
            return
        super().execute(SET_SCHEMA, (_schema(self.connection),))
        super().executemany(query, params_seq, returning=returning)


class SchemaServerCursor(psycopg.ServerCursor[Any]):
    """A named cursor lives in a transaction already (see export); it sets the schema there."""

    def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        binary: bool | None = None,
        **kwargs: Any,
    ) -> SchemaServerCursor:
        self.connection.execute(SET_SCHEMA, (_schema(self.connection),))
        return super().execute(query, params, binary=binary, **kwargs)
