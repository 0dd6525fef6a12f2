"""The dashboard's connections are held across samples: a PostgreSQL connection lent and given
back is lent again, one that broke or was left in a transaction is closed and replaced, no more
than IDLE_KEPT wait idle, and there is one Redis client."""

from __future__ import annotations

from typing import Any, cast

import pytest
from psycopg import pq

from ops.dashboard.connections import Connections
from shared.settings import Settings

pytestmark = pytest.mark.unit


class FakeInfo:
    def __init__(self) -> None:
        self.transaction_status = pq.TransactionStatus.IDLE


class FakeConnection:
    """What Connections asks of a psycopg connection."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False
        self.broken = False
        self.info = FakeInfo()

    def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self) -> None:
        self.opened: list[FakeConnection] = []

    def __call__(self) -> Any:
        conn = FakeConnection(len(self.opened))
        self.opened.append(conn)
        return conn


class FakeRedis:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def fake(conn: Any) -> FakeConnection:
    """The fake behind a lent connection (typed as psycopg's)."""
    return cast(FakeConnection, conn)


def connections(idle_kept: int = 4) -> tuple[Connections, Opener, list[FakeRedis]]:
    opener, clients = Opener(), []

    def open_redis() -> Any:
        clients.append(FakeRedis())
        return clients[-1]

    links = Connections(Settings.from_env({}), open_db=opener, open_redis=open_redis, idle_kept=idle_kept)
    return links, opener, clients


def test_a_connection_given_back_is_lent_again_over_many_samples() -> None:
    links, opener, _ = connections()
    for _ in range(50):
        with links.db() as lent_conn:
            conn = fake(lent_conn)
            assert conn.number == 0
    assert len(opener.opened) == 1 and links.db_opened == 1 and links.idle == 1


def test_readers_at_the_same_moment_get_their_own_and_only_idle_kept_stay() -> None:
    links, opener, _ = connections(idle_kept=2)
    with links.db() as a, links.db() as b, links.db() as c:
        assert len({fake(lent).number for lent in (a, b, c)}) == 3
    assert links.idle == 2
    assert [conn.closed for conn in opener.opened].count(True) == 1  # the third is not kept
    with links.db(), links.db():
        pass
    assert len(opener.opened) == 3  # the two kept are lent again


def test_a_broken_connection_or_one_left_in_a_transaction_is_closed_and_replaced() -> None:
    links, opener, _ = connections()
    with links.db() as lent_conn:
        conn = fake(lent_conn)
        conn.broken = True
    with links.db() as lent_conn:
        conn = fake(lent_conn)
        assert conn.number == 1
        conn.info.transaction_status = pq.TransactionStatus.INTRANS
    with links.db() as lent_conn:
        conn = fake(lent_conn)
        assert conn.number == 2
    assert opener.opened[0].closed and opener.opened[1].closed and not opener.opened[2].closed


def test_a_connection_closed_while_idle_is_not_lent() -> None:
    links, opener, _ = connections()
    with links.db():
        pass
    opener.opened[0].closed = True  # the server ended it between two samples
    with links.db() as lent_conn:
        conn = fake(lent_conn)
        assert conn.number == 1


def test_an_error_in_the_block_still_gives_the_connection_back() -> None:
    links, opener, _ = connections()
    with pytest.raises(ValueError), links.db():
        raise ValueError("a query failed")
    with links.db() as lent_conn:
        conn = fake(lent_conn)
        assert conn.number == 0
    assert len(opener.opened) == 1


def test_one_redis_client_and_close_ends_everything() -> None:
    links, opener, clients = connections()
    assert links.redis is links.redis
    with links.db():
        pass
    links.close()
    assert len(clients) == 1 and clients[0].closed
    assert opener.opened[0].closed and links.idle == 0
