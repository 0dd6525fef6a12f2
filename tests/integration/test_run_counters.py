"""The per-run counters (run_counters, shared/postgres/schema.sql) equal what count(*) over the rows says,
through every writer's statements: the worker's page and skip upserts (redeliveries included),
the dead-letter consumer's upsert, a replay, a purge, an operator's bulk SQL and TRUNCATE; an
existing database gets its counters filled in when it upgrades; and two writers of one run
never wait for each other's counter row."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pytest

from dlq_consumer import store
from dlq_consumer.record import record_from_delivery
from ops.accounting import Accounting, account, latest_runs
from shared.consumer import Delivery
from shared.messages import CrawlTask, Failure, Progress
from shared.postgres import db
from shared.postgres.skips import UPSERT_SKIP
from shared.settings import Settings
from worker.store.rows import STORE_PAGES, PageRow, page_params

pytestmark = pytest.mark.integration

RUN = "counted"

COUNTED = """
SELECT (SELECT count(*) FROM pages WHERE run_id = %(run)s),
       (SELECT count(*) FROM pages WHERE run_id = %(run)s AND from_cache),
       (SELECT count(*) FROM pages WHERE run_id = %(run)s AND failed_attempts > 0),
       (SELECT count(*) FROM pages WHERE run_id = %(run)s AND writes > 1),
       (SELECT coalesce(sum(failed_attempts), 0) FROM pages WHERE run_id = %(run)s)
     + (SELECT coalesce(sum(greatest(attempts - 1, 0)), 0) FROM dead_letters
        WHERE run_id = %(run)s AND state = 'dead')
"""


def page(url: str, *, run: str = RUN, failed: int = 0, cached: bool = False) -> dict[str, Any]:
    row = PageRow(
        run,
        url,
        url,
        200,
        "text/html",
        "t",
        None,
        None,
        None,
        None,
        "text",
        [],
        "bulk",
        failed,
        cached,
        5,
        "w",
    )
    return page_params(row)


def skip(url: str, reason: str = "robots") -> dict[str, Any]:
    return {"run_id": RUN, "url": url, "reason": reason, "detail": "", "worker_id": "w"}


def dead(conn: psycopg.Connection[Any], url: str, reason: str, attempts: int = 3) -> None:
    body = CrawlTask(url=url, run_id=RUN, queue="bulk").encode()
    headers = {**Failure(reason).to_headers(), **Progress(attempt=attempts).to_headers()}
    store.upsert(conn, record_from_delivery(Delivery("dead", body, headers, redelivered=False), "ns"))


def by_count(conn: psycopg.Connection[Any]) -> Accounting:
    """What account() must say, counted row by row."""
    row = conn.execute(COUNTED, {"run": RUN}).fetchone()
    assert row is not None
    stored, cached, after_retry, rewritten, retries = (int(v) for v in row)
    dead_rows = conn.execute(
        "SELECT reason, count(*) FROM dead_letters WHERE run_id = %s AND state = 'dead' GROUP BY reason",
        (RUN,),
    )
    skips = conn.execute("SELECT reason, count(*) FROM skips WHERE run_id = %s GROUP BY reason", (RUN,))
    return Accounting(
        run_id=RUN,
        stored=stored,
        from_cache=cached,
        stored_after_retry=after_retry,
        rewritten_rows=rewritten,
        retries=retries,
        dead_by_reason={str(r): int(n) for r, n in dead_rows},
        skips_by_reason={str(r): int(n) for r, n in skips},
    )


def replayed(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(n), 0)::bigint FROM run_counters WHERE run_id = %s AND kind = 'replayed'", (RUN,)
    ).fetchone()
    return int(row[0]) if row else -1


def test_counters_follow_every_writer_and_a_redelivery_counts_once(settings: Settings) -> None:
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        for n in range(5):
            STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}", failed=n % 2, cached=n == 0)])
        # Redeliveries: the same rows again, twice; only the first rewrite marks a row rewritten.
        for _ in range(2):
            STORE_PAGES.execute(conn, [page("https://a.test/p1", failed=1)])
        STORE_PAGES.execute(conn, [page("https://a.test/p2", failed=2)])  # a later copy failed more
        for n in range(3):
            conn.execute(UPSERT_SKIP, skip(f"https://a.test/s{n}"))
        conn.execute(UPSERT_SKIP, skip("https://a.test/s0", "cancelled"))  # its reason rewritten
        for n in range(4):
            dead(conn, f"https://a.test/d{n}", "http_500")
        dead(conn, "https://a.test/d0", "http_500")  # the same dead letter delivered again
        dead(conn, "https://a.test/d1", "timeout", attempts=5)  # rewritten with another reason
        # A page stored after its URL was dead-lettered and skipped: the page wins both.
        STORE_PAGES.execute(conn, [page("https://a.test/d2")])
        STORE_PAGES.execute(conn, [page("https://a.test/s1")])
        dead(conn, "https://a.test/p0", "http_500")  # a stale copy of a stored URL: not recorded
        # A replay marks a row, a purge deletes replayed ones in one statement.
        conn.execute("UPDATE dead_letters SET state = 'replayed' WHERE url LIKE '%%/d3'")
        dead(conn, "https://a.test/r0", "http_404")
        conn.execute("UPDATE dead_letters SET state = 'replayed' WHERE url LIKE '%%/r0'")
        assert replayed(conn) == 2
        assert store.delete(conn, store.Selection(run_id=RUN, state="replayed")) == 2
        # A page of another run, and an operator's bulk delete.
        STORE_PAGES.execute(conn, [page("https://a.test/p0", run="other")])
        conn.execute("DELETE FROM pages WHERE run_id = %s AND url LIKE '%%/p4'", (RUN,))

        expected = by_count(conn)
        assert account(settings, RUN) == expected
        assert replayed(conn) == 0
    assert expected == Accounting(
        run_id=RUN,
        stored=6,  # p0..p3, d2, s1
        from_cache=1,
        stored_after_retry=3,  # p1, p3, and p2 once a later copy of it had failed twice
        rewritten_rows=2,  # p1, p2
        retries=1 + 2 + 1 + 2 + 4,  # pages p1, p2, p3; dead d0 (3 attempts), d1 (5)
        dead_by_reason={"http_500": 1, "timeout": 1},
        skips_by_reason={"cancelled": 1, "robots": 1},
    )


def test_a_writers_batch_is_counted_exactly_as_its_rows_one_by_one(settings: Settings) -> None:
    """A batch's pages are one statement, counted once a statement: new rows, rewrites, a URL
    twice in the batch, pages that win over a dead letter and a skip, and an operator's bulk
    updates, counted or not."""
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}", failed=n % 3) for n in range(6)])
        dead(conn, "https://a.test/d0", "http_500")
        conn.execute(UPSERT_SKIP, skip("https://a.test/s0"))
        batch = [
            page("https://a.test/p1", failed=2),  # a redelivery, which had failed more
            page("https://a.test/n0", cached=True),
            page("https://a.test/n0", failed=1),  # twice in one batch: written twice, in order
            page("https://a.test/d0"),
            page("https://a.test/s0"),
            page("https://a.test/p2"),
        ]
        with conn.transaction():
            STORE_PAGES.execute(conn, batch)
        written = conn.execute("SELECT url, writes, from_cache FROM pages WHERE url LIKE '%%/n0'")
        assert written.fetchall() == [("https://a.test/n0", 2, False)]
        assert account(settings, RUN) == by_count(conn)
        conn.execute("UPDATE pages SET title = 'retitled' WHERE run_id = %s", (RUN,))  # nothing counted
        conn.execute("UPDATE pages SET failed_attempts = 4 WHERE url LIKE '%%/p0'")
        conn.execute("UPDATE pages SET run_id = 'other' WHERE url LIKE '%%/p5'")
        expected = by_count(conn)
        assert account(settings, RUN) == expected
        assert account(settings, "other").stored == 1
    assert (expected.stored, expected.rewritten_rows, expected.dead, expected.skipped) == (8, 3, 0, 0)
    assert expected.retries == 2 + 2 + 1 + 1 + 4  # p1, p2 (kept the higher), p4, n0, p0


def test_truncate_empties_the_counters_of_that_table(settings: Settings) -> None:
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        STORE_PAGES.execute(conn, [page("https://a.test/p")])
        conn.execute(UPSERT_SKIP, skip("https://a.test/s"))
        conn.execute("TRUNCATE pages")
        assert account(settings, RUN) == Accounting(RUN, skips_by_reason={"robots": 1})


def test_a_database_written_before_the_counters_gets_them_on_upgrade(settings: Settings) -> None:
    """As a database of the previous version: rows, no triggers, no counters; the next start
    (ensure_schema with a new schema file) fills them in from the rows."""
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        for trigger, table in [
            (t, table)
            for table in ("pages", "dead_letters", "skips")
            for t in ("counted", "counted_update", "counted_truncate")
        ] + [("counted_delete", "pages"), ("counted_delete", "dead_letters")]:
            conn.execute(f"DROP TRIGGER {table}_{trigger} ON {table}")
        conn.execute("DROP TABLE run_counters")
        for n in range(7):
            STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}", failed=n % 3)])
        STORE_PAGES.execute(conn, [page("https://a.test/p0")])
        dead(conn, "https://a.test/d", "http_500")
        conn.execute(UPSERT_SKIP, skip("https://a.test/s"))
        conn.execute("DELETE FROM schema_applied")  # as if schema.sql had changed since
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        expected = by_count(conn)
        assert expected.stored == 7 and expected.dead == 1 and expected.skipped == 1
        assert account(settings, RUN) == expected
        # From now on the triggers count, and nothing is counted twice.
        STORE_PAGES.execute(conn, [page("https://a.test/p9")])
        assert account(settings, RUN) == dataclasses.replace(expected, stored=8)
        runs = latest_runs(conn)
        assert [(r.run_id, r.stored, r.dead, r.skipped) for r in runs] == [(RUN, 8, 1, 1)]


def test_a_database_counting_row_by_row_counts_by_statement_after_upgrade(settings: Settings) -> None:
    """As a database of the previous version, whose page triggers counted a row at a time: the
    next start puts the statement triggers in their place, and nothing is counted twice or lost."""
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        conn.execute("DROP TRIGGER pages_counted ON pages")
        conn.execute("DROP TRIGGER pages_counted_update ON pages")
        conn.execute(
            "CREATE TRIGGER pages_counted AFTER INSERT ON pages FOR EACH ROW"
            " EXECUTE FUNCTION run_counters_page()"
        )
        conn.execute(
            "CREATE TRIGGER pages_counted_update AFTER UPDATE ON pages FOR EACH ROW"
            " WHEN (OLD.fetched_at IS DISTINCT FROM NEW.fetched_at) EXECUTE FUNCTION run_counters_page()"
        )
        for n in range(4):
            STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}", failed=n % 2)])
        conn.execute("DELETE FROM schema_applied")  # as if schema.sql had changed since
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        kinds = conn.execute(
            "SELECT tgname, tgtype & 1 FROM pg_trigger WHERE tgrelid = 'pages'::regclass"
            " AND tgname IN ('pages_counted', 'pages_counted_update') ORDER BY tgname"
        )
        assert kinds.fetchall() == [("pages_counted", 0), ("pages_counted_update", 0)]  # statement
        STORE_PAGES.execute(conn, [page("https://a.test/p1", failed=3), page("https://a.test/p9")])
        expected = by_count(conn)
        assert account(settings, RUN) == expected
    assert (expected.stored, expected.rewritten_rows, expected.retries) == (5, 1, 1 + 3)


def test_two_writers_of_one_run_never_wait_for_each_other(settings: Settings) -> None:
    db.ensure_schema(settings)
    with db.connect(settings) as first, db.connect(settings) as second:
        STORE_PAGES.execute(first, [page("https://a.test/1")])  # its transaction stays open
        second.execute("SET lock_timeout = '2s'")
        STORE_PAGES.execute(second, [page("https://a.test/2")])  # would time out on a shared row
        second.commit()
        first.commit()
    with db.connect(settings, autocommit=True) as conn:
        writers = conn.execute("SELECT count(DISTINCT writer) FROM run_counters WHERE run_id = %s", (RUN,))
        assert writers.fetchone() == (2,)
    assert account(settings, RUN).stored == 2
