"""The writer isolates rows PostgreSQL refuses for their data, and commits the others at once.

A fake connection stands in for PostgreSQL: it refuses any transaction holding a marked row,
as the server refuses a whole transaction for one bad row, and records what it commits."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shared.errors import ServiceUnavailable, UnstorableRow
from shared.postgres import db
from shared.settings import Settings
from worker.store.rows import PageRow
from worker.store.writer import ResultStore

REFUSED = {
    "http://a.test/out-of-range": psycopg.errors.NumericValueOutOfRange("integer out of range"),
    "http://a.test/too-long": psycopg.errors.ProgramLimitExceeded("index row size 9000 exceeds maximum 2704"),
    "http://a.test/duplicate": psycopg.errors.UniqueViolation("duplicate key value"),
    "http://a.test/our-bug": psycopg.errors.UndefinedColumn('column "nope" does not exist'),
}


class FakeDatabase:
    def __init__(self, down_after: int | None = None) -> None:
        self.committed: list[str] = []
        self.transactions = 0
        self.autocommitted = 0  # statements sent alone, outside a transaction block
        self.down_after = down_after  # transactions before the connection is lost

    def connect(self, _settings: Settings) -> Any:
        return FakeConnection(self)


class FakeConnection:
    closed = False

    def __init__(self, database: FakeDatabase) -> None:
        self.database = database
        self.written: list[str] = []
        self.in_transaction = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        db = self.database
        db.transactions += 1
        if db.down_after is not None and db.transactions > db.down_after:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        self.written, self.in_transaction = [], True
        try:
            yield
        finally:
            self.in_transaction = False
        db.committed += self.written

    @contextlib.contextmanager
    def cursor(self) -> Iterator[FakeConnection]:
        yield self

    def executemany(self, query: str, rows: list[dict[str, Any]]) -> None:
        for params in rows:
            self.execute(query, params)

    def execute(self, query: str, params: dict[str, Any]) -> None:
        """The connection autocommits: a statement sent alone is a transaction of its own. A
        batch's pages come as one statement, an array of each column."""
        if not self.in_transaction:
            self.database.autocommitted += 1
            with self.transaction():
                self.execute(query, params)
            return
        if "INSERT INTO pages" not in query:
            return
        urls = params["url"] if isinstance(params["url"], list) else [params["url"]]
        for url in urls:
            if url in REFUSED:
                raise REFUSED[url]
            self.written.append(url)

    def close(self) -> None:
        pass


def page(url: str) -> PageRow:
    return PageRow(
        "r", url, url, 200, "text/html", None, None, None, None, None, "", [], "bulk", 0, False, 1, "w"
    )


def write_batch(database: FakeDatabase, urls: list[str], **options: Any) -> dict[str, BaseException | None]:
    """Hand in the rows as one batch (the writer waits until it is full) and wait for them."""
    store = ResultStore(
        Settings(), batch_rows=len(urls), batch_wait_s=3600, connect=database.connect, **options
    )
    outcomes: dict[str, BaseException | None] = {}
    for url in urls:
        store.save_page_later(page(url), functools.partial(outcomes.__setitem__, url))
    store.close()
    return outcomes


def test_a_batch_without_bad_rows_is_one_statement() -> None:
    database = FakeDatabase()
    urls = [f"http://a.test/{i}" for i in range(16)]
    outcomes = write_batch(database, urls)
    assert outcomes == dict.fromkeys(urls)
    assert database.committed == urls and database.transactions == 1
    assert database.autocommitted == 1  # one statement is atomic without a transaction block


def test_a_url_twice_in_a_batch_is_written_twice_in_one_transaction() -> None:
    database = FakeDatabase()
    urls = ["http://a.test/1", "http://a.test/2", "http://a.test/1", "http://a.test/1"]
    outcomes = write_batch(database, urls)
    assert outcomes == dict.fromkeys(urls)
    # One statement may not write a row twice: three, in the order handed in.
    assert database.committed == ["http://a.test/1", "http://a.test/2", "http://a.test/1", "http://a.test/1"]
    assert database.transactions == 1 and database.autocommitted == 0


def test_a_lone_row_is_one_statement_without_a_transaction_block() -> None:
    database = FakeDatabase()
    outcomes = write_batch(database, ["http://a.test/1"])
    assert outcomes == {"http://a.test/1": None}
    assert database.committed == ["http://a.test/1"]
    assert database.transactions == 1 and database.autocommitted == 1


@pytest.mark.parametrize(
    "bad", ["http://a.test/out-of-range", "http://a.test/too-long", "http://a.test/duplicate"]
)
def test_a_row_refused_for_its_data_is_isolated_and_the_rest_committed(bad: str) -> None:
    database = FakeDatabase()
    good = [f"http://a.test/{i}" for i in range(15)]
    outcomes = write_batch(database, [*good[:7], bad, *good[7:]])
    assert sorted(database.committed) == sorted(good)
    assert all(outcomes[url] is None for url in good)
    refusal = outcomes[bad]
    assert isinstance(refusal, UnstorableRow) and refusal.reason == "unstorable"
    assert str(REFUSED[bad]) in refusal.detail
    assert database.transactions <= 1 + 2 * 4  # a bisection: about 2·log2(16) more, not 16


def test_several_bad_rows_each_end_on_their_own() -> None:
    database = FakeDatabase()
    good = [f"http://a.test/{i}" for i in range(30)]
    bad = ["http://a.test/out-of-range", "http://a.test/too-long"]
    outcomes = write_batch(database, [*good[:3], bad[0], *good[3:20], bad[1], *good[20:]])
    assert sorted(database.committed) == sorted(good)
    assert [type(outcomes[url]) for url in bad] == [UnstorableRow, UnstorableRow]


def test_an_error_that_is_not_the_data_is_passed_on_as_it_is() -> None:
    database = FakeDatabase()
    outcomes = write_batch(database, ["http://a.test/1", "http://a.test/our-bug"])
    assert outcomes["http://a.test/1"] is None
    assert isinstance(outcomes["http://a.test/our-bug"], psycopg.errors.UndefinedColumn)


def test_a_lost_connection_is_an_outage_not_a_bad_row() -> None:
    database = FakeDatabase(down_after=0)
    pauses: list[float] = []
    outcomes = write_batch(
        database, ["http://a.test/1", "http://a.test/2"], patience_s=3.0, sleep=pauses.append
    )
    assert all(isinstance(error, ServiceUnavailable) for error in outcomes.values())
    assert pauses == [1.0, 2.0] and database.committed == []


def test_an_outage_during_the_bisection_keeps_the_rows_not_yet_settled() -> None:
    database = FakeDatabase(down_after=2)  # the whole batch, then its first half, then down
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        database.down_after = None  # back up

    urls = [f"http://a.test/{i}" for i in range(8)]
    outcomes = write_batch(database, [*urls[:2], "http://a.test/too-long", *urls[2:]], sleep=sleep)
    assert pauses == [1.0]
    assert sorted(database.committed) == sorted(urls)
    assert isinstance(outcomes["http://a.test/too-long"], UnstorableRow)
    assert len(outcomes) == 9


@pytest.mark.parametrize(
    ("error", "data"),
    [
        (psycopg.errors.NumericValueOutOfRange("integer out of range"), True),  # 22003
        (psycopg.errors.ProgramLimitExceeded("index row size exceeds maximum"), True),  # 54000
        (psycopg.errors.StringDataRightTruncation("value too long"), True),  # 22001
        (psycopg.errors.UniqueViolation("duplicate key"), True),  # 23505
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"), True),  # client-side
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), True),  # cannot be sent
        (psycopg.errors.AdminShutdown("terminating connection"), False),  # 57P01
        (psycopg.errors.ConnectionFailure("connection failure"), False),  # 08006
        (psycopg.OperationalError("server closed the connection unexpectedly"), False),
        (psycopg.errors.UndefinedColumn("no such column"), False),  # our bug, not the row's data
    ],
)
def test_errors_are_told_apart_by_sqlstate_class(error: BaseException, data: bool) -> None:
    assert db.is_data_error(error) is data


def test_translate_lets_a_data_error_through_and_turns_a_lost_connection_into_an_outage() -> None:
    with pytest.raises(psycopg.errors.ProgramLimitExceeded), db.translate(Settings()):
        raise psycopg.errors.ProgramLimitExceeded("index row size exceeds maximum")
    with pytest.raises(ServiceUnavailable), db.translate(Settings()):
        raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")


class GatedDatabase(FakeDatabase):
    """Each transaction waits for `gate`: the writer is kept busy while rows pile up behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.in_transaction = threading.Event()

    def connect(self, _settings: Settings) -> Any:
        return GatedConnection(self)


class GatedConnection(FakeConnection):
    database: GatedDatabase

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.database.in_transaction.set()
        self.database.gate.wait()
        with super().transaction():
            yield


@pytest.mark.timeout(30)
def test_a_caller_left_behind_a_full_batch_does_not_wait_out_the_window() -> None:
    database = GatedDatabase()
    store = ResultStore(Settings(), batch_rows=2, batch_wait_s=3600, connect=database.connect)
    for url in ("http://a.test/0", "http://a.test/1"):
        store.save_page_later(page(url), lambda _error: None)
    assert database.in_transaction.wait(10)  # the writer holds the first batch
    for url in ("http://a.test/2", "http://a.test/3"):
        store.save_page_later(page(url), lambda _error: None)
    waiting = threading.Thread(target=store.save_page, args=(page("http://a.test/waited-for"),))
    waiting.start()
    while len(store._pending) < 3:  # the full batch and the caller's row behind it
        time.sleep(0.01)
    database.gate.set()
    waiting.join(20)
    assert not waiting.is_alive()
    assert database.committed[-1] == "http://a.test/waited-for"
    store.close()
