"""The timeline's buckets (run_timeline, shared/postgres/schema.sql) equal what count(*) over the
rows says per step, through every writer's statements: the worker's page and skip upserts and a
redelivery's rewrite, the dead-letter consumer's upsert, a replay, a purge, an operator's bulk
UPDATE and DELETE, TRUNCATE; rows moved out of the kept hour are left out; a slot reused an hour
later starts over; and an existing database gets its buckets when it upgrades."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from dlq_consumer import store
from ops.dashboard import data
from ops.dashboard.connections import Connections
from shared.postgres import db
from shared.postgres.skips import UPSERT_SKIP
from shared.settings import Settings
from tests.integration.test_run_counters import RUN, dead, page, skip
from worker.store.rows import STORE_PAGES

pytestmark = pytest.mark.integration


def both_ways(conn: psycopg.Connection[Any], minutes: int = 15, step_s: int = 10) -> tuple[Any, Any]:
    """The timeline's steps from the buckets and from count(*) over the rows, for the same now()."""
    with conn.transaction():
        row = conn.execute(data.TIMELINE_NOW, {"step_s": step_s, "steps": minutes * 60 // step_s}).fetchone()
        assert row is not None
        params = {"run_id": RUN, "step_s": step_s, "first": row[1]}
        buckets = conn.execute(data.TIMELINE, params).fetchall()
        rows = conn.execute(data.TIMELINE_FROM_ROWS, params).fetchall()
    return (
        sorted((str(k), t, int(n)) for k, t, n in buckets if n),
        sorted((str(k), t, int(n)) for k, t, n in rows),
    )


def test_buckets_follow_every_writer(settings: Settings) -> None:
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        for n in range(6):
            STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}")])
        # Spread over the window, so that rows fall in several buckets and steps.
        conn.execute("UPDATE pages SET fetched_at = now() - interval '3 minutes' WHERE url LIKE '%%p1'")
        conn.execute("UPDATE pages SET fetched_at = now() - interval '9 minutes 5 s' WHERE url LIKE '%%p2'")
        STORE_PAGES.execute(conn, [page("https://a.test/p2", failed=1)])  # a redelivery writes it again now
        conn.execute("UPDATE pages SET fetched_at = now() - interval '2 hours' WHERE url LIKE '%%p3'")
        for n in range(3):
            conn.execute(UPSERT_SKIP, skip(f"https://a.test/s{n}"))
        conn.execute("UPDATE skips SET recorded_at = now() - interval '4 minutes' WHERE url LIKE '%%s0'")
        conn.execute(UPSERT_SKIP, skip("https://a.test/s1", "cancelled"))
        for n in range(4):
            dead(conn, f"https://a.test/d{n}", "http_500")
        conn.execute(
            "UPDATE dead_letters SET last_failed_at = now() - interval '7 minutes' WHERE url LIKE '%%d0'"
        )
        dead(conn, "https://a.test/d1", "timeout", attempts=5)  # died again
        conn.execute("UPDATE dead_letters SET state = 'replayed' WHERE url LIKE '%%/d2'")
        assert store.delete(conn, store.Selection(run_id=RUN, state="replayed")) == 1
        STORE_PAGES.execute(conn, [page("https://a.test/d3")])  # a page stored after its URL died
        conn.execute("DELETE FROM pages WHERE run_id = %s AND url LIKE '%%/p4'", (RUN,))
        STORE_PAGES.execute(conn, [page("https://a.test/x", run="other")])

        buckets, rows = both_ways(conn)
        assert buckets == rows
        assert sum(n for k, _, n in rows if k == "page") == 5  # p0, p1, p2, p5, d3 (p3 is too old, p4 gone)
        by_minute, rows_by_minute = both_ways(conn, 30, 60)
        assert by_minute == rows_by_minute
        # The dashboard's timeline is those figures, step by step.
        links = Connections(settings)
        try:
            points = data.timeline(links, RUN)
        finally:
            links.close()
        assert len(points) == 91
        assert sum(p["stored"] for p in points) == 5
        assert sum(p["dead"] for p in points) == 2  # d0, d1
        assert sum(p["skipped"] for p in points) == 3
        conn.execute("TRUNCATE pages")
        buckets, rows = both_ways(conn)
        assert buckets == rows and {k for k, _, _ in rows} == {"dead", "skip"}


def test_a_writers_open_bucket_hands_on_to_the_timeline(settings: Settings) -> None:
    """A writer's latest 10 s stays on its counter row; a later bucket takes its place and hands
    it on to run_timeline, an earlier one goes there itself; the timeline reads both."""
    db.ensure_schema(settings)
    # One transaction: one now() for every row, however near the next 10 s it is.
    with db.connect(settings, autocommit=True) as conn, conn.transaction():
        for n in range(4):
            STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}")])
        handed = "SELECT sum(n)::int FROM run_timeline WHERE run_id = %s AND kind = 'page'"
        assert conn.execute(handed, (RUN,)).fetchone() == (None,)
        opened = "SELECT open_n FROM run_counters WHERE run_id = %s AND kind = 'page'"
        assert conn.execute(opened, (RUN,)).fetchall() == [(4,)]
        # Moved 30 s on: its bucket is later than the open one, which is handed on with its 3.
        conn.execute("UPDATE pages SET fetched_at = now() + interval '30 s' WHERE url LIKE '%%p0'")
        assert conn.execute(handed, (RUN,)).fetchone() == (3,)
        assert conn.execute(opened, (RUN,)).fetchall() == [(1,)]
        # Stored now, earlier than the open bucket: counted in run_timeline straight away.
        STORE_PAGES.execute(conn, [page("https://a.test/p9")])
        assert conn.execute(handed, (RUN,)).fetchone() == (4,)
        buckets, rows = both_ways(conn)
        assert buckets == rows and sum(n for _, _, n in rows) == 5


def test_a_slot_written_an_hour_later_starts_over(settings: Settings) -> None:
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        conn.execute("SELECT run_timeline_add(%s, 'page', now() - interval '40 minutes', 3)", (RUN,))
        conn.execute("SELECT run_timeline_add(%s, 'page', now() + interval '20 minutes', 1)", (RUN,))
        kept = conn.execute("SELECT bucket > now(), n FROM run_timeline WHERE run_id = %s", (RUN,)).fetchall()
        assert kept == [(True, 1)]
        # An outcome older than the buckets are kept is not counted: its slot may hold a later one.
        conn.execute("SELECT run_timeline_add(%s, 'page', now() - interval '80 minutes', 5)", (RUN,))
        kept_n = conn.execute("SELECT sum(n)::int FROM run_timeline WHERE run_id = %s", (RUN,)).fetchone()
        assert kept_n == (1,)


def test_buckets_follow_a_batch_and_a_bulk_update_of_many_buckets(settings: Settings) -> None:
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}") for n in range(12)])
        # One statement moving rows to many buckets, some out of the kept hour.
        conn.execute(
            "UPDATE pages SET fetched_at ="
            " now() - make_interval(mins => 7 * substring(url from 'p(\\d+)$')::int)"
        )
        batch = [page("https://a.test/p3", failed=1), page("https://a.test/p3"), page("https://a.test/q")]
        with conn.transaction():
            STORE_PAGES.execute(conn, batch)  # p3 moved back to now, written twice
        buckets, rows = both_ways(conn, 45, 60)
        assert buckets == rows
        assert sum(n for _, _, n in rows) == 8  # p0..p6 and q; p8..p11 are older than the kept 50 min


def test_a_database_written_before_the_buckets_gets_them_on_upgrade(settings: Settings) -> None:
    """As a database of the previous version: counters, update triggers that did not watch the
    commit times, no buckets; the next start fills them in from the rows of the kept hour."""
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        for n in range(5):
            STORE_PAGES.execute(conn, [page(f"https://a.test/p{n}")])
        dead(conn, "https://a.test/d", "http_500")
        conn.execute(UPSERT_SKIP, skip("https://a.test/s"))
        conn.execute("DROP TRIGGER pages_counted_update ON pages")
        conn.execute(
            "CREATE TRIGGER pages_counted_update AFTER UPDATE ON pages FOR EACH ROW"
            " WHEN (OLD.run_id IS DISTINCT FROM NEW.run_id) EXECUTE FUNCTION run_counters_page()"
        )
        conn.execute("DELETE FROM run_timeline")
        conn.execute("DELETE FROM schema_applied")  # as if schema.sql had changed since
    db.ensure_schema(settings)
    with db.connect(settings, autocommit=True) as conn:
        buckets, rows = both_ways(conn)
        assert buckets == rows and sum(n for _, _, n in rows) == 7
        conn.execute("UPDATE pages SET fetched_at = now() - interval '5 minutes' WHERE url LIKE '%%p0'")
        STORE_PAGES.execute(conn, [page("https://a.test/p9")])
        buckets, rows = both_ways(conn)
        assert buckets == rows and sum(n for _, _, n in rows) == 8
