"""What the worker stores and how: the rows of a page and of a skip, the SQL that upserts them,
and their values made ready for PostgreSQL.

Apart from the writer (worker/store/writer.py), which batches rows and commits them on a thread of its
own: what a row holds and which statement writes it change with the schema, how rows are batched
and committed does not. A skip's row is written by UPSERT_SKIP (shared/postgres/skips.py), which
ops/runs.py runs too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

# A batch's pages arrive as one array a column, unnest'ed back into rows: one statement for the
# whole batch, so that the per-run counters' statement triggers (shared/postgres/schema.sql)
# count the batch once instead of once a row. The columns and their types, in the arrays' order.
PAGE_COLUMNS = {
    "run_id": "text", "url": "text", "final_url": "text", "http_status": "integer",
    "content_type": "text", "title": "text", "meta_description": "text", "canonical_url": "text",
    "lang": "text", "h1": "text", "body_text": "text", "links": "jsonb", "queue": "text",
    "failed_attempts": "integer", "from_cache": "boolean", "not_modified": "boolean",
    "proxy": "text", "fetch_ms": "integer", "worker_id": "text", "content_hash": "text",
    "profile": "text", "extracted": "jsonb", "warc_filename": "text", "warc_offset": "bigint",
    "warc_length": "bigint", "previous_run": "text",
}  # fmt: skip

_STORED = [column for column in PAGE_COLUMNS if column != "previous_run"]

UPSERT_PAGES = f"""
INSERT INTO pages ({", ".join(_STORED)}, unchanged)
SELECT {", ".join(f"batch.{column}" for column in _STORED)},
       -- On a recrawl: does the text match the earlier run's? NULL when there is nothing to compare.
       (SELECT earlier.content_hash = batch.content_hash FROM pages AS earlier
        WHERE earlier.run_id = batch.previous_run AND earlier.url = batch.url)
FROM batch
ON CONFLICT (run_id, url) DO UPDATE SET
    final_url = EXCLUDED.final_url, http_status = EXCLUDED.http_status,
    content_type = EXCLUDED.content_type, title = EXCLUDED.title,
    meta_description = EXCLUDED.meta_description, canonical_url = EXCLUDED.canonical_url,
    lang = EXCLUDED.lang, h1 = EXCLUDED.h1, body_text = EXCLUDED.body_text, links = EXCLUDED.links,
    queue = EXCLUDED.queue, failed_attempts = GREATEST(pages.failed_attempts, EXCLUDED.failed_attempts),
    from_cache = EXCLUDED.from_cache, not_modified = EXCLUDED.not_modified, proxy = EXCLUDED.proxy,
    fetch_ms = EXCLUDED.fetch_ms, worker_id = EXCLUDED.worker_id,
    content_hash = EXCLUDED.content_hash, profile = EXCLUDED.profile, extracted = EXCLUDED.extracted,
    unchanged = EXCLUDED.unchanged,
    -- A redelivered URL's later record: the row names exactly one (docs/WARC.md).
    warc_filename = EXCLUDED.warc_filename, warc_offset = EXCLUDED.warc_offset,
    warc_length = EXCLUDED.warc_length,
    fetched_at = now(), writes = pages.writes + 1
"""

# The other order: a URL dead-lettered by one copy and then stored by another. The page wins,
# and the dead letter is kept for inspection but no longer counts (state 'superseded').
SUPERSEDE_DEAD_LETTERS = """
UPDATE dead_letters SET state = 'superseded' FROM batch
WHERE dead_letters.run_id = batch.run_id AND dead_letters.url = batch.url
  AND dead_letters.state = 'dead'
"""

# Likewise a URL skipped by one copy (its run cancelled) while another was being fetched: the
# page wins and the skip goes, so the URL is counted once.
DROP_SKIPS = "DELETE FROM skips USING batch WHERE skips.run_id = batch.run_id AND skips.url = batch.url"


@dataclass(frozen=True)
class ManyRows:
    """A statement that writes many rows in one execution, from one array of values a column;
    a lone row goes by `one_row_sql`, the same statement fed plain values, which costs the
    writer less than half what the arrays' encoding does for a page alone.

    One execution may not write a row twice (INSERT ... ON CONFLICT DO UPDATE refuses to), so
    rows with the same `key` go to executions one after another, in the order handed in: a URL
    handed in twice in one batch is written twice, as two statements would have.
    """

    sql: str
    one_row_sql: str
    columns: tuple[str, ...]
    key: tuple[str, ...]

    def executions(self, rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """Each statement to send for `rows` with its parameters, in order."""
        rounds: list[list[dict[str, Any]]] = []
        seen: dict[tuple[Any, ...], int] = {}  # how many of each key's rows are placed
        for row in rows:
            key = tuple(row[column] for column in self.key)
            placed = seen.get(key, 0)
            seen[key] = placed + 1
            if placed == len(rounds):
                rounds.append([])
            rounds[placed].append(row)
        return [
            (self.one_row_sql, part[0])
            if len(part) == 1
            else (self.sql, {column: [row[column] for row in part] for column in self.columns})
            for part in rounds
        ]

    def execute(
        self, conn: psycopg.Connection[Any] | psycopg.Cursor[Any], rows: list[dict[str, Any]]
    ) -> None:
        for sql, params in self.executions(rows):
            conn.execute(sql, params)


def _store_pages(batch: str) -> str:
    """The pages' upsert and its two clean-ups, as one statement, for the rows `batch` selects:
    data-modifying CTEs run whether or not the outer query reads them, in the same snapshot (the
    three touch different tables). One statement a row instead of three cost PostgreSQL 17-44%
    less CPU a row, and the writer 33-45% less, in batches of 1 to 16 rows; one a batch instead
    of one a row, see docs/PERFORMANCE.md."""
    return f"""
WITH batch AS ({batch}),
page AS ({UPSERT_PAGES.strip()} RETURNING 1),
superseded AS ({SUPERSEDE_DEAD_LETTERS.strip()}),
dropped AS ({DROP_SKIPS.strip()})
SELECT 1
"""


# The arrays in binary: psycopg's text form of an array escapes each value with a regular
# expression, twice the writer's CPU of the rest of a batch.
STORE_PAGES = ManyRows(
    _store_pages(
        f"SELECT * FROM unnest({', '.join(f'%({c})b::{t}[]' for c, t in PAGE_COLUMNS.items())})"
        f" AS batch ({', '.join(PAGE_COLUMNS)})"
    ),
    _store_pages(f"SELECT {', '.join(f'%({c})s::{t} AS {c}' for c, t in PAGE_COLUMNS.items())}"),
    columns=tuple(PAGE_COLUMNS),
    key=("run_id", "url"),
)


@dataclass(frozen=True)
class PageRow:
    run_id: str
    url: str
    final_url: str
    http_status: int
    content_type: str
    title: str | None
    meta_description: str | None
    canonical_url: str | None
    lang: str | None
    h1: str | None
    body_text: str
    links: list[str]
    queue: str
    failed_attempts: int
    from_cache: bool
    fetch_ms: int | None
    worker_id: str
    not_modified: bool = False  # a 304 answer: the cached body was reused
    proxy: str | None = None  # scheme://host:port it came through, never credentials
    content_hash: str | None = None  # of the visible text, to tell unchanged pages on a recrawl
    profile: str | None = None  # the extraction profile that applied
    extracted: dict[str, Any] = field(default_factory=dict)
    previous_run: str | None = None  # on a recrawl, the run to compare content_hash with
    # With WARC_DIR set: the page's response or revisit record, as file, offset and length.
    warc_filename: str | None = None
    warc_offset: int | None = None
    warc_length: int | None = None


@dataclass(frozen=True)
class SkipRow:
    run_id: str
    url: str
    reason: str
    detail: str
    worker_id: str


def page_params(row: PageRow) -> dict[str, Any]:
    # clean() inlined for the strings, most of a row's values and all of its links: one call a
    # value and a link was 46 calls a page of 20 links.
    fields = row.__dict__.items()
    params = {k: v.replace("\x00", "") if type(v) is str else clean(v) for k, v in fields if k != "links"}
    params["links"] = Jsonb([v.replace("\x00", "") if type(v) is str else clean(v) for v in row.links])
    params["extracted"] = Jsonb(params["extracted"])
    return params


def clean(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL characters; a hostile page can."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value
