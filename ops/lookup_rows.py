"""What PostgreSQL holds of one URL for ops.lookup: its page rows, dead letters and skips."""

from __future__ import annotations

from shared.postgres import db
from shared.settings import Settings

# Per kind of row: a query of one URL (and perhaps one run) returning the run and a summary.
# Inside format(), %% is a literal % to psycopg.
ROW_QUERIES = {
    "page": """
        SELECT run_id, format('HTTP %%s, %%s, fetched %%s by %%s in %%s ms%%s, %%s failed attempts before%%s',
                              http_status, queue, fetched_at, worker_id, fetch_ms,
                              CASE WHEN from_cache THEN ' (from cache)' ELSE '' END, failed_attempts,
                              -- where its WARC record is: what `tail -c +OFFSET+1 | head -c LENGTH` reads
                              CASE WHEN warc_filename IS NULL THEN ''
                                   ELSE format('; WARC record in %%s at offset %%s, %%s bytes',
                                               warc_filename, warc_offset, warc_length) END)
        FROM pages WHERE url = %(url)s""",
    "dead letter": """
        SELECT run_id, format('%%s (%%s), %%s attempts, %%s replays, from %%s at %%s: %%s',
                              reason, state, attempts, replays, origin_queue, last_failed_at,
                              left(last_error, 200))
        FROM dead_letters WHERE url = %(url)s""",
    "skip": """
        SELECT run_id, format('%%s at %%s by %%s: %%s', reason, recorded_at, worker_id, left(detail, 200))
        FROM skips WHERE url = %(url)s""",
}
RUN_FILTER = " AND run_id = %(run)s"


def rows_of(settings: Settings, url: str, run_id: str | None) -> list[tuple[str, str, str]]:
    """(kind, run, summary) of every row of `url`, in the order of ROW_QUERIES, then by run."""
    found: list[tuple[str, str, str]] = []
    db.ensure_schema(settings)
    with db.translate(settings), db.connect(settings) as conn:
        for kind, query in ROW_QUERIES.items():
            sql = query + (RUN_FILTER if run_id else "") + " ORDER BY run_id"
            for run, summary in conn.execute(sql, {"url": url, "run": run_id}).fetchall():
                found.append((kind, str(run), str(summary)))
    return found
