"""Export against a seeded pages table: every row comes back, value for value, in both formats."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from ops.export import DEFAULT_FIELDS, ITERSIZE, export, export_to_file, page_columns, stream_pages
from shared.postgres import db
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
RUN = "run-x"
ROWS = ITERSIZE * 2 + 345  # more than two server-side batches, and a partial last one
# Text that CSV must quote or escape, and characters outside ASCII.
AWKWARD = ["plain", "comma, inside", 'quote " inside', "line\nbreak", "crlf\r\nbreak", "ünïcødé ✓", ""]
# How a CSV cell turns back into a value, by the column's type in the database; any other type
# is text. Read from the table, so columns added later are checked too.
FROM_CSV: dict[str, Callable[[str], Any]] = {
    "integer": int,
    "boolean": lambda cell: {"true": True, "false": False}[cell],
    "jsonb": json.loads,
    "timestamp with time zone": datetime.fromisoformat,
}
COLUMN_TYPES = """
SELECT column_name, data_type FROM information_schema.columns
WHERE table_schema = %s AND table_name = 'pages'
"""

INSERT = """
INSERT INTO pages (run_id, url, final_url, http_status, content_type, title, meta_description,
    canonical_url, lang, h1, body_text, links, queue, failed_attempts, from_cache, fetch_ms,
    worker_id, fetched_at, writes, not_modified, proxy)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def seed_row(n: int, run_id: str = RUN) -> tuple[Any, ...]:
    text = AWKWARD[n % len(AWKWARD)]
    url = f"https://example.com/page/{n:05d}"
    return (
        run_id,
        url,
        url + "?final",
        200 if n % 10 else 301,
        "text/html; charset=utf-8",
        None if n % 5 == 0 else f"title {n} {text}",  # NULL and text, empty text included
        text,
        None if n % 3 else url,
        None if n % 4 == 0 else "en",
        f"h1 {text}",
        f"body {n}\n{text}",
        Jsonb([f"https://example.com/link/{n}", {"note": text}] if n % 2 else []),
        ("priority", "ttl", "bulk")[n % 3],
        n % 3,
        n % 2 == 0,
        None if n % 7 == 0 else n * 3,
        f"worker-{n % 4}",
        datetime(2026, 11, 25, 12, 0, tzinfo=UTC) + timedelta(seconds=n, microseconds=n * 7),
        1 + n % 2,
        n % 6 == 0,
        None if n % 2 else "http://proxy.example:3128",
    )


@pytest.fixture
def seeded(settings: Settings) -> Settings:
    """ROWS pages of RUN, inserted in shuffled order, and two pages of another run."""
    db.ensure_schema(settings)
    with db.connect(settings) as conn, conn.cursor() as cursor:
        order = sorted(range(ROWS), key=lambda n: (n * 7919) % ROWS)
        cursor.executemany(INSERT, [seed_row(n) for n in order])
        cursor.executemany(INSERT, [seed_row(n, "other-run") for n in range(2)])
    return settings


def database_rows(settings: Settings, fields: list[str]) -> list[dict[str, Any]]:
    with db.connect(settings, autocommit=True) as conn:
        cursor = conn.execute(
            f"SELECT {', '.join(fields)} FROM pages WHERE run_id = %s ORDER BY url",  # names from the table
            (RUN,),
        )
        return [dict(zip(fields, row, strict=True)) for row in cursor]


def all_columns(settings: Settings) -> list[str]:
    with db.connect(settings, autocommit=True) as conn:
        return page_columns(conn, settings.pg_schema)


def column_types(settings: Settings) -> dict[str, str]:
    with db.connect(settings, autocommit=True) as conn:
        return {str(name): str(kind) for name, kind in conn.execute(COLUMN_TYPES, (settings.pg_schema,))}


def from_json(kind: str, value: Any) -> Any:
    return (
        datetime.fromisoformat(value) if kind == "timestamp with time zone" and value is not None else value
    )


def from_csv(kind: str, cell: str) -> Any:
    """A CSV cell back into the database's value; an empty cell is NULL for non-text columns."""
    parse = FROM_CSV.get(kind)
    if parse is None:
        return cell
    return None if cell == "" else parse(cell)


def as_csv_sees_it(row: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    """CSV has no NULL: a NULL text value comes back as an empty string."""
    return {k: ("" if v is None and types[k] not in FROM_CSV else v) for k, v in row.items()}


def test_jsonl_round_trips_every_column_of_every_row(seeded: Settings, tmp_path: Path) -> None:
    fields = all_columns(seeded)
    target = tmp_path / "pages.jsonl"

    written = export_to_file(seeded, RUN, "jsonl", fields, target)

    lines = target.read_text(encoding="utf-8").splitlines()
    types = column_types(seeded)
    parsed = [{k: from_json(types[k], v) for k, v in json.loads(line).items()} for line in lines]
    expected = database_rows(seeded, fields)
    assert written == len(lines) == ROWS
    assert [list(p) for p in parsed[:1]] == [fields]  # the fields, in the order asked
    assert parsed == expected
    assert not list(tmp_path.glob("*.partial"))


def test_csv_round_trips_every_column_of_every_row(seeded: Settings, tmp_path: Path) -> None:
    fields = all_columns(seeded)
    target = tmp_path / "pages.csv"

    written = export_to_file(seeded, RUN, "csv", fields, target)

    types = column_types(seeded)
    with target.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        parsed = [
            {k: from_csv(types[k], cell) for k, cell in zip(header, row, strict=True)} for row in reader
        ]
    assert header == fields
    assert written == len(parsed) == ROWS
    assert parsed == [as_csv_sees_it(row, types) for row in database_rows(seeded, fields)]


def test_default_fields_in_url_order(seeded: Settings) -> None:
    out = io.StringIO()

    export(seeded, RUN, "jsonl", list(DEFAULT_FIELDS), out)

    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert all(list(r) == list(DEFAULT_FIELDS) for r in records)
    urls = [r["url"] for r in records]
    assert urls == sorted(urls) and len(urls) == ROWS
    assert records[0]["fetched_at"] == "2026-11-25T12:00:00+00:00"


def test_rows_stream_from_a_server_side_cursor(seeded: Settings) -> None:
    with db.connect(seeded) as conn:
        rows = stream_pages(conn, RUN, ["url"])
        first = next(rows)
        # The rows are still on the server: a cursor is open there while we read.
        open_cursors = conn.execute("SELECT count(*) FROM pg_cursors WHERE name = 'export_pages'").fetchone()
        rest = sum(1 for _ in rows)
    assert first == ("https://example.com/page/00000",)
    assert open_cursors == (1,)
    assert rest == ROWS - 1


def run_export(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PG_SCHEMA": settings.pg_schema, "DATABASE_URL": settings.database_url}
    return subprocess.run(
        [sys.executable, "-m", "ops.export", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_command_writes_to_stdout(seeded: Settings) -> None:
    done = run_export(seeded, "--run", RUN, "--format", "jsonl", "--fields", "url,http_status")

    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == ROWS
    assert records[10] == {"url": "https://example.com/page/00010", "http_status": 301}
    assert f"{ROWS} pages" in done.stderr


def test_an_unknown_field_is_one_line_naming_it_and_exit_2(seeded: Settings) -> None:
    done = run_export(seeded, "--run", RUN, "--format", "csv", "--fields", "url,no_such_column")

    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "'no_such_column'" in lines[0]
    assert "valid fields: run_id, url, final_url" in lines[0]
