"""Writing results to PostgreSQL. Every write is an idempotent upsert keyed on (run_id, url), so a
redelivered message rewrites its row instead of adding a second one."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from shared import db
from shared.settings import Settings

UPSERT_PAGE = """
INSERT INTO pages (run_id, url, final_url, http_status, content_type, title, meta_description,
                   canonical_url, lang, h1, body_text, links, queue, failed_attempts, from_cache,
                   fetch_ms, worker_id)
VALUES (%(run_id)s, %(url)s, %(final_url)s, %(http_status)s, %(content_type)s, %(title)s,
        %(meta_description)s, %(canonical_url)s, %(lang)s, %(h1)s, %(body_text)s, %(links)s,
        %(queue)s, %(failed_attempts)s, %(from_cache)s, %(fetch_ms)s, %(worker_id)s)
ON CONFLICT (run_id, url) DO UPDATE SET
    final_url = EXCLUDED.final_url, http_status = EXCLUDED.http_status,
    content_type = EXCLUDED.content_type, title = EXCLUDED.title,
    meta_description = EXCLUDED.meta_description, canonical_url = EXCLUDED.canonical_url,
    lang = EXCLUDED.lang, h1 = EXCLUDED.h1, body_text = EXCLUDED.body_text, links = EXCLUDED.links,
    queue = EXCLUDED.queue, failed_attempts = GREATEST(pages.failed_attempts, EXCLUDED.failed_attempts),
    from_cache = EXCLUDED.from_cache, fetch_ms = EXCLUDED.fetch_ms, worker_id = EXCLUDED.worker_id,
    fetched_at = now(), writes = pages.writes + 1
"""

UPSERT_SKIP = """
INSERT INTO skips (run_id, url, reason, detail, worker_id)
VALUES (%(run_id)s, %(url)s, %(reason)s, %(detail)s, %(worker_id)s)
ON CONFLICT (run_id, url) DO UPDATE SET
    reason = EXCLUDED.reason, detail = EXCLUDED.detail, worker_id = EXCLUDED.worker_id,
    recorded_at = now()
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


@dataclass(frozen=True)
class SkipRow:
    run_id: str
    url: str
    reason: str
    detail: str
    worker_id: str


class ResultStore:
    """One PostgreSQL connection per handler thread; each call commits before it returns."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._local = threading.local()
        self._opened: list[psycopg.Connection[tuple[object, ...]]] = []
        self._opened_lock = threading.Lock()

    def close(self) -> None:
        """Close every thread's connection; call once the handler threads have stopped."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()

    def save_page(self, row: PageRow) -> None:
        params = {**row.__dict__, "links": Jsonb(row.links)}
        self._write(UPSERT_PAGE, params)

    def save_skip(self, row: SkipRow) -> None:
        self._write(UPSERT_SKIP, dict(row.__dict__))

    def _write(self, query: str, params: dict[str, object]) -> None:
        with db.translate(self.settings):
            conn = self._connection()
            try:
                with conn.transaction():
                    conn.execute(query, params)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                self._local.conn = None  # reconnect on the next call
                raise

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        conn: psycopg.Connection[tuple[object, ...]] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = db.connect(self.settings, autocommit=True)
            self._local.conn = conn
            with self._opened_lock:
                self._opened.append(conn)
        return conn
