"""python -m ops.export --run ID --format jsonl|csv [--fields f1,f2] [--output FILE]

Writes a run's pages, ordered by URL, as JSON lines or CSV. Rows stream from a server-side
cursor, ITERSIZE at a time, so a run of millions of pages needs no more memory than a few
thousand rows. Any column of the pages table can be chosen; the defaults are the fields a
reader of the results usually wants (no body text, no links).

Values: timestamps are ISO 8601 in UTC, `links` is a JSON array. In JSON lines a NULL is
`null`; in CSV a NULL and an empty string both become an empty cell (CSV has no NULL), and
booleans are `true`/`false`, nested JSON is JSON text.

A file is written under a temporary name and renamed when complete, so a failed export never
leaves a file that looks finished.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg import sql

from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.postgres import db
from shared.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_FIELDS = (
    "url",
    "final_url",
    "http_status",
    "title",
    "meta_description",
    "canonical_url",
    "lang",
    "h1",
    "fetched_at",
    "worker_id",
)
FORMATS = ("jsonl", "csv")
ITERSIZE = 1000  # rows per round trip of the server-side cursor
PAGE_COLUMNS = """
SELECT column_name FROM information_schema.columns
WHERE table_schema = %s AND table_name = 'pages' ORDER BY ordinal_position
"""


def page_columns(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The columns of the pages table, as the database has them (migrations included)."""
    return [str(row[0]) for row in conn.execute(PAGE_COLUMNS, (schema,))]


def check_fields(fields: Sequence[str], columns: Sequence[str]) -> None:
    """Raise ConfigError naming the first unknown field and listing the valid ones."""
    if not fields:
        raise ConfigError(f"--fields: name at least one of: {', '.join(columns)}")
    for name in fields:
        if name not in columns:
            raise ConfigError(f"--fields: no column {name!r} in pages; valid fields: {', '.join(columns)}")
    repeated = sorted({name for name in fields if fields.count(name) > 1})
    if repeated:
        raise ConfigError(f"--fields: {', '.join(repeated)} named twice")


def stream_pages(
    conn: psycopg.Connection[Any], run_id: str, fields: Sequence[str]
) -> Iterator[tuple[Any, ...]]:
    """The run's pages, `fields` in that order, fetched ITERSIZE rows at a time.

    A named (server-side) cursor lives in a transaction: `conn` must not be in autocommit."""
    query = sql.SQL("SELECT {} FROM pages WHERE run_id = %s ORDER BY url").format(
        sql.SQL(", ").join(sql.Identifier(name) for name in fields)
    )
    with conn.cursor(name="export_pages") as cursor:
        cursor.itersize = ITERSIZE
        cursor.execute(query, (run_id,))
        yield from cursor


def json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


def csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def write_jsonl(rows: Iterator[tuple[Any, ...]], fields: Sequence[str], out: TextIO) -> int:
    count = 0
    for row in rows:
        record = {name: json_value(value) for name, value in zip(fields, row, strict=True)}
        out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        count += 1
    return count


def write_csv(rows: Iterator[tuple[Any, ...]], fields: Sequence[str], out: TextIO) -> int:
    writer = csv.writer(out)
    writer.writerow(fields)
    count = 0
    for row in rows:
        writer.writerow([csv_cell(value) for value in row])
        count += 1
    return count


WRITERS = {"jsonl": write_jsonl, "csv": write_csv}


def export(settings: Settings, run_id: str, fmt: str, fields: Sequence[str], out: TextIO) -> int:
    """Write the run's pages to `out`; return how many were written."""
    with db.translate(settings), db.connect(settings) as conn:
        columns = page_columns(conn, settings.pg_schema)
        if not columns:
            raise ConfigError(f"PG_SCHEMA {settings.pg_schema!r}: there is no pages table to export")
        check_fields(fields, columns)
        return WRITERS[fmt](stream_pages(conn, run_id, fields), fields, out)


def export_to_file(settings: Settings, run_id: str, fmt: str, fields: Sequence[str], path: Path) -> int:
    partial = path.with_name(path.name + ".partial")
    try:
        # newline="": the csv module writes its own line endings.
        with partial.open("w", encoding="utf-8", newline="") as out:
            count = export(settings, run_id, fmt, fields, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    return count


def parse_fields(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.export", description="Write the pages of one run as JSON lines or CSV."
    )
    parser.add_argument("--run", metavar="ID", required=True, help="the run whose pages to write")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="jsonl (default) or csv")
    parser.add_argument(
        "--fields",
        type=parse_fields,
        default=list(DEFAULT_FIELDS),
        help=f"comma-separated pages columns (default: {','.join(DEFAULT_FIELDS)})",
    )
    parser.add_argument("--output", metavar="FILE", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "export", settings.log_format)
    if args.output is None:
        try:
            count = export(settings, args.run, args.format, args.fields, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader stopped early (`| head`), which is its right. Point stdout at /dev/null
            # so that the interpreter's last flush does not fail a second time.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    else:
        count = export_to_file(settings, args.run, args.format, args.fields, args.output)
    # On stderr, so that it never mixes with rows written to stdout.
    print(f"export: {count} pages of run {args.run} written to {args.output or 'stdout'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main("export", main)
