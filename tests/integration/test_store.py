"""Result writes are idempotent: a redelivered URL rewrites its row, never adds one."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator

import pytest

from dlq_consumer.store import UPSERT_DEAD_LETTER
from ops.accounting import Tally, account
from shared.errors import ServiceUnavailable, UnstorableRow
from shared.postgres import db
from shared.settings import Settings
from worker.store.rows import PageRow, SkipRow
from worker.store.writer import ResultStore


def page(url: str, title: str, worker: str = "w1") -> PageRow:
    return PageRow(
        run_id="r1",
        url=url,
        final_url=url,
        http_status=200,
        content_type="text/html",
        title=title,
        meta_description=None,
        canonical_url=None,
        lang="en",
        h1="h",
        body_text="text",
        links=["http://a.test/x"],
        queue="bulk",
        failed_attempts=0,
        from_cache=False,
        fetch_ms=5,
        worker_id=worker,
    )


def count(settings: Settings, query: str) -> int:
    with db.connect(settings, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    counted = row[0]
    assert isinstance(counted, int)
    return counted


@pytest.fixture
def store(settings: Settings) -> Iterator[ResultStore]:
    db.ensure_schema(settings)
    db.ensure_schema(settings)  # every service runs it at start: must be repeatable
    made = ResultStore(settings)
    yield made
    made.close()


def test_the_same_page_twice_is_one_row_rewritten(settings: Settings, store: ResultStore) -> None:
    store.save_page(page("http://a.test/1", "first"))
    store.save_page(page("http://a.test/1", "second", worker="w2"))
    assert count(settings, "SELECT count(*) FROM pages") == 1
    with db.connect(settings, autocommit=True) as conn:
        assert conn.execute("SELECT title, worker_id, writes FROM pages").fetchone() == ("second", "w2", 2)


def test_concurrent_writers_of_one_url_leave_one_row(settings: Settings, store: ResultStore) -> None:
    # One connection per thread, as in the worker.
    threads = [
        threading.Thread(target=store.save_page, args=(page("http://a.test/same", f"t{i}"),))
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert count(settings, "SELECT count(*) FROM pages") == 1
    assert count(settings, "SELECT writes FROM pages") == 8


def test_a_skip_twice_is_one_row(settings: Settings, store: ResultStore) -> None:
    for _ in range(2):
        store.save_skip(SkipRow("r1", "http://a.test/private", "robots", "Disallow: /private", "w1"))
    assert count(settings, "SELECT count(*) FROM skips") == 1


def test_one_bad_row_does_not_fail_the_rows_batched_with_it(settings: Settings) -> None:
    db.ensure_schema(settings)
    store = ResultStore(settings, batch_wait_s=0.3)  # long enough for all four to share a batch
    errors: list[BaseException] = []

    def save(row: PageRow) -> None:
        try:
            store.save_page(row)
        except Exception as exc:
            errors.append(exc)

    rows = [page(f"http://a.test/{i}", f"t{i}") for i in range(3)]
    bad = dataclasses.replace(page("http://a.test/bad", "bad"), http_status=2**40)  # integer out of range
    threads = [threading.Thread(target=save, args=(row,)) for row in [*rows, bad]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    assert len(errors) == 1
    assert count(settings, "SELECT count(*) FROM pages") == 3


@pytest.mark.timeout(30)
def test_a_full_batch_commits_without_waiting_out_the_window(settings: Settings) -> None:
    db.ensure_schema(settings)
    # A window far past the test's timeout: only full batches can get these rows committed.
    store = ResultStore(settings, batch_rows=5, batch_wait_s=3600)
    committed = threading.Semaphore(0)
    errors: list[BaseException] = []

    def settled(error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)
        committed.release()

    for i in range(25):
        store.save_page_later(page(f"http://a.test/{i}", f"t{i}"), settled)
    for _ in range(25):
        committed.acquire()
    assert errors == []
    assert count(settings, "SELECT count(*) FROM pages") == 25
    store.close()


@pytest.mark.timeout(30)
def test_a_caller_waiting_for_its_row_does_not_wait_out_the_window(settings: Settings) -> None:
    db.ensure_schema(settings)
    store = ResultStore(settings, batch_rows=100, batch_wait_s=3600)
    later: list[BaseException | None] = []
    store.save_page_later(page("http://a.test/later", "t"), later.append)
    store.save_skip(SkipRow("r1", "http://a.test/skipped", "robots", "disallowed", "w1"))
    store.save_page(page("http://a.test/now", "t"))
    # The row handed in before them shared their commit.
    assert later == [None]
    assert count(settings, "SELECT count(*) FROM pages") == 2
    assert count(settings, "SELECT count(*) FROM skips") == 1
    store.close()


@pytest.mark.timeout(30)
def test_rows_are_committed_at_once_when_the_worker_has_nothing_else_in_hand(settings: Settings) -> None:
    db.ensure_schema(settings)
    store = ResultStore(settings, batch_rows=100, batch_wait_s=3600)
    store.commit_soon()  # nothing waiting: nothing to commit, and the writer stays asleep
    committed: list[BaseException | None] = []
    done = threading.Event()

    def settled(error: BaseException | None) -> None:
        committed.append(error)
        if len(committed) == 2:
            done.set()

    store.save_page_later(page("http://a.test/1", "t"), settled)
    store.save_page_later(page("http://a.test/2", "t"), settled)
    assert not done.wait(0.5)  # the window is an hour: they wait for more rows
    assert count(settings, "SELECT count(*) FROM pages") == 0
    store.commit_soon()
    assert done.wait(10)
    assert committed == [None, None]
    assert count(settings, "SELECT count(*) FROM pages") == 2
    store.close()


def test_nul_characters_from_hostile_pages_are_dropped(settings: Settings, store: ResultStore) -> None:
    store.save_page(dataclasses.replace(page("http://a.test/nul", "a\x00b"), links=["http://a.test/\x00"]))
    with db.connect(settings, autocommit=True) as conn:
        assert conn.execute("SELECT title, links->>0 FROM pages").fetchone() == ("ab", "http://a.test/")


def test_a_recrawled_page_says_whether_its_text_changed(settings: Settings, store: ResultStore) -> None:
    base = page("http://a.test/1", "t")
    store.save_page(dataclasses.replace(base, run_id="first", content_hash="aaa"))
    store.save_page(dataclasses.replace(page("http://a.test/2", "t"), run_id="first", content_hash="bbb"))
    store.save_page(dataclasses.replace(base, run_id="again", content_hash="aaa", previous_run="first"))
    store.save_page(
        dataclasses.replace(
            page("http://a.test/2", "t"), run_id="again", content_hash="ccc", previous_run="first"
        )
    )
    store.save_page(dataclasses.replace(page("http://a.test/3", "t"), run_id="again", previous_run="first"))
    with db.connect(settings, autocommit=True) as conn:
        rows = conn.execute("SELECT url, unchanged FROM pages WHERE run_id = 'again'").fetchall()
    found = {url: unchanged for url, unchanged in rows}
    assert found == {"http://a.test/1": True, "http://a.test/2": False, "http://a.test/3": None}


def test_storing_a_page_supersedes_a_dead_letter_of_the_same_url(
    settings: Settings, store: ResultStore
) -> None:
    with db.connect(settings, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dead_letters (run_id, url, reason, body) VALUES ('r1', 'http://a.test/1', 'x', '')"
        )
    store.save_page(page("http://a.test/1", "late copy"))
    with db.connect(settings, autocommit=True) as conn:
        assert conn.execute("SELECT state FROM dead_letters").fetchall() == [("superseded",)]


def test_a_tally_counts_what_the_full_accounting_counts(settings: Settings, store: ResultStore) -> None:
    with Tally(settings, "r1") as tally:
        assert tally.accounted() == 0
        for n in range(3):
            store.save_page(page(f"http://a.test/{n}", "t"))
        store.save_page(page("http://a.test/0", "again"))  # a rewrite is still one URL
        store.save_skip(SkipRow("r1", "http://a.test/private", "robots", "Disallow: /private", "w1"))
        with db.connect(settings, autocommit=True) as conn:
            for url, state in (("http://a.test/gone", "dead"), ("http://a.test/replayed", "replayed")):
                conn.execute(
                    "INSERT INTO dead_letters (run_id, url, reason, body, state) "
                    "VALUES ('r1', %s, 'http_404', '', %s)",
                    (url, state),
                )
        store.save_page(dataclasses.replace(page("http://a.test/other-run", "t"), run_id="r2"))
        # 3 pages, 1 skip, 1 dead letter; the replayed letter and the other run's page do not count
        assert tally.accounted() == account(settings, "r1").accounted == 5


def test_page_text_is_compressed_with_lz4(settings: Settings, store: ResultStore) -> None:
    store.save_page(dataclasses.replace(page("http://a.test/long", "t"), body_text="word " * 2000))
    with db.connect(settings, autocommit=True) as conn:
        method = conn.execute(
            "SELECT attcompression FROM pg_attribute "
            "WHERE attrelid = 'pages'::regclass AND attname = 'body_text'"
        ).fetchone()
        stored = conn.execute("SELECT pg_column_compression(body_text) FROM pages").fetchone()
    assert method == ("l",) and stored == ("lz4",)


def test_the_writer_waits_out_a_short_outage_and_gives_up_after_its_patience(settings: Settings) -> None:
    db.ensure_schema(settings)
    unreachable = dataclasses.replace(settings, database_url="postgresql://postgres@127.0.0.1:1/crawler")
    pauses: list[float] = []

    def sleep(seconds: float) -> None:  # the outage ends during the third pause
        pauses.append(seconds)
        if len(pauses) == 3:
            writer.settings = settings

    store = writer = ResultStore(unreachable, patience_s=10.0, sleep=sleep)
    outcomes: list[BaseException | None] = []
    store.save_page_later(page("http://a.test/1", "t"), outcomes.append)
    store.save_page(page("http://a.test/2", "t"))  # behind it: committed once the outage is over
    assert outcomes == [None] and pauses == [1.0, 2.0, 4.0]
    assert count(settings, "SELECT count(*) FROM pages") == 2

    store.close()

    pauses.clear()
    store = ResultStore(unreachable, patience_s=10.0, sleep=pauses.append)
    with pytest.raises(ServiceUnavailable):  # 1 + 2 + 4 + 8 s waited: past the patience
        store.save_page(page("http://a.test/3", "t"))
    assert pauses == [1.0, 2.0, 4.0, 8.0]
    store.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"run_id": "r" * 1_000_000}, "index row"),  # ProgramLimitExceeded, SQLSTATE 54000
        ({"failed_attempts": 10**18}, "out of range"),  # NumericValueOutOfRange, 22003
        ({"title": "lone \ud800 surrogate"}, "surrogate"),  # cannot be encoded to send
        ({"extracted": {"price": float("nan")}}, "json"),  # NaN is not JSON: 22P02
    ],
)
def test_rows_refused_for_their_data_are_unstorable_and_their_batch_is_stored(
    settings: Settings, change: dict[str, object], message: str
) -> None:
    """The issue's 1 MB run id stalled every write of its worker: now the bad row alone fails,
    as `unstorable` with the database's message, and the rows batched with it are committed."""
    db.ensure_schema(settings)
    store = ResultStore(settings, batch_rows=8, batch_wait_s=3600)  # the 8 rows share one batch
    outcomes: dict[str, BaseException | None] = {}
    rows = [page(f"http://a.test/{i}", f"t{i}") for i in range(7)]
    rows.insert(3, dataclasses.replace(page("http://a.test/bad", "bad"), **change))  # type: ignore[arg-type]
    for row in rows:
        store.save_page_later(row, functools.partial(outcomes.__setitem__, row.url))
    store.close()
    refusal = outcomes.pop("http://a.test/bad")
    assert isinstance(refusal, UnstorableRow) and message in refusal.detail.lower()
    assert outcomes == {f"http://a.test/{i}": None for i in range(7)}
    assert count(settings, "SELECT count(*) FROM pages") == 7
    # The connection is still good: the next batch stores.
    after = ResultStore(settings)
    after.save_page(page("http://a.test/after", "t"))
    after.close()
    assert count(settings, "SELECT count(*) FROM pages") == 8


def test_a_skip_refused_for_its_data_raises_unstorable(settings: Settings, store: ResultStore) -> None:
    with pytest.raises(UnstorableRow):
        store.save_skip(SkipRow("r" * 1_000_000, "http://a.test/x", "robots", "", "w1"))
    store.save_skip(SkipRow("r1", "http://a.test/x", "robots", "", "w1"))
    assert count(settings, "SELECT count(*) FROM skips") == 1


def test_every_url_keeps_one_outcome_whichever_copy_comes_first(
    settings: Settings, store: ResultStore
) -> None:
    """Copies of a URL taken after its run was cancelled: a page, a skip and a dead letter
    for the same URL count once."""
    with db.connect(settings, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dead_letters (run_id, url, reason, body)"
            " VALUES ('r1', 'http://a.test/dead', 'x', '')"
        )
    store.save_page(page("http://a.test/stored", "t"))
    for url in ("http://a.test/stored", "http://a.test/dead", "http://a.test/skipped"):
        store.save_skip(SkipRow("r1", url, "cancelled", "cancelled", "w1"))
    store.save_page(page("http://a.test/skipped", "a copy fetched before the cancel"))
    dead_letter = {
        "run_id": "r1",
        "url": "http://a.test/stored",
        "reason": "http_500",
        "last_error": "e",
        "http_status": 500,
        "attempts": 3,
        "replays": 0,
        "origin_queue": "bulk",
        "worker_id": "w1",
        "body": b"",
        "x_death": None,
        "first_failed_at": None,
        "body_bytes": 0,
        "body_sha256": None,
    }
    store.save_skip(SkipRow("r1", "http://a.test/skip-only", "cancelled", "cancelled", "w1"))
    with db.connect(settings, autocommit=True) as conn:
        conn.execute(UPSERT_DEAD_LETTER, dead_letter)
        conn.execute(UPSERT_DEAD_LETTER, {**dead_letter, "url": "http://a.test/skip-only"})
    a = account(settings, "r1")
    assert (a.stored, a.dead, a.skipped) == (2, 1, 1)  # stored, skipped / dead, skip-only
    with db.connect(settings, autocommit=True) as conn:
        outcomes = conn.execute(
            "SELECT url, 'page' FROM pages UNION ALL SELECT url, 'skip' FROM skips"
            " UNION ALL SELECT url, 'dead' FROM dead_letters WHERE state = 'dead' ORDER BY 1"
        ).fetchall()
    assert outcomes == [
        ("http://a.test/dead", "dead"),
        ("http://a.test/skip-only", "skip"),
        ("http://a.test/skipped", "page"),
        ("http://a.test/stored", "page"),
    ]
