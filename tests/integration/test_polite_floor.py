"""bench.polite_floor against the real services: each page does every step, and nothing of the
bench is left behind."""

from __future__ import annotations

from pathlib import Path

from psycopg import sql

from bench.polite_floor import SITE_PAGES, PageSteps, cpu_us_a_page, loopback_site
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.settings import Settings
from tests.integration.test_teardown import exists


def test_every_page_is_fetched_parsed_stored_and_acked(settings: Settings, tmp_path: Path) -> None:
    pages = SITE_PAGES + 2  # past the site's last page, so pages are served again under new keys
    with loopback_site(tmp_path) as origin, PageSteps(settings, origin, messages=pages) as steps:
        assert cpu_us_a_page(steps, pages, pause_s=0.0) > 0
        stored = steps.pg.execute(
            sql.SQL("SELECT url, title FROM {}.pages ORDER BY url").format(steps.schema)
        )
        rows = stored.fetchall()
        assert len(rows) == pages
        assert {title for _, title in rows} == {f"/p{n}.html" for n in range(SITE_PAGES)}
        steps.channel.basic_recover(requeue=True)  # anything still unacked goes back to the queue
        left = steps.channel.queue_declare(steps.queue, passive=True).method.message_count
        assert left == 0
    with db.connect(settings) as conn:
        schemas = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (settings.pg_schema,))
        assert schemas.fetchone() is None
    with connect_redis(settings, OPERATOR) as client:
        assert not client.exists(f"{settings.crawl_namespace}:slot")
    assert not exists(settings, f"{settings.crawl_namespace}.floor")
