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

from psycopg.types.json import Jsonb

UPSERT_PAGE = """
INSERT INTO pages (run_id, url, final_url, http_status, content_type, title, meta_description,
                   canonical_url, lang, h1, body_text, links, queue, failed_attempts, from_cache,
                   not_modified, proxy, fetch_ms, worker_id, content_hash, profile, extracted,
                   warc_filename, warc_offset, warc_length, unchanged)
VALUES (%(run_id)s, %(url)s, %(final_url)s, %(http_status)s, %(content_type)s, %(title)s,
        %(meta_description)s, %(canonical_url)s, %(lang)s, %(h1)s, %(body_text)s, %(links)s,
        %(queue)s, %(failed_attempts)s, %(from_cache)s, %(not_modified)s, %(proxy)s, %(fetch_ms)s,
        %(worker_id)s, %(content_hash)s, %(profile)s, %(extracted)s,
        %(warc_filename)s, %(warc_offset)s, %(warc_length)s,
        -- On a recrawl: does the text match the earlier run's? NULL when there is nothing to compare.
        (SELECT earlier.content_hash = %(content_hash)s FROM pages AS earlier
         WHERE earlier.run_id = %(previous_run)s AND earlier.url = %(url)s))
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
SUPERSEDE_DEAD_LETTER = """
UPDATE dead_letters SET state = 'superseded'
WHERE run_id = %(run_id)s AND url = %(url)s AND state = 'dead'
"""

# Likewise a URL skipped by one copy (its run cancelled) while another was being fetched: the
# page wins and the skip goes, so the URL is counted once.
DROP_SKIP = "DELETE FROM skips WHERE run_id = %(run_id)s AND url = %(url)s"

# The page's upsert and its two clean-ups above, as one statement: data-modifying CTEs run
# whether or not the outer query reads them, in the same snapshot (the three touch different
# tables). One statement a row instead of three cost PostgreSQL 17-44% less CPU a row, and the
# writer 33-45% less, in batches of 1 to 16 rows.
STORE_PAGE = f"""
WITH page AS ({UPSERT_PAGE.strip()} RETURNING 1),
     superseded AS ({SUPERSEDE_DEAD_LETTER.strip()}),
     dropped AS ({DROP_SKIP.strip()})
SELECT 1
"""


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
