"""python -m ops.warc check DIR [--run ID] | cdxj DIR --run ID [--output FILE]

`check`: every closed WARC file in DIR is whole (nothing after its last whole record) and its
digests match its blocks and payloads, as warcio computes them; every page row (of the run, or
of every run) that names a record in DIR finds exactly one response or revisit record at its
offset and length, for its URL. Files still being written (`.open`) are read, not judged whole:
their writer may be in the middle of a record. Exits 1 naming each problem, 0 when there is none.

`cdxj`: the CDXJ index of a run's records (ops/cdxj.py), for pywb and other replay tools.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ops import cdxj
from ops.warc_read import RecordHead, closed_files, file_problems, heads, open_files, record_at
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.postgres import db
from shared.settings import Settings

ROWS = """
SELECT url, final_url, warc_filename, warc_offset, warc_length FROM pages
WHERE warc_filename IS NOT NULL AND (%(run)s::text IS NULL OR run_id = %(run)s) ORDER BY run_id, url
"""


def page_rows(settings: Settings, run_id: str | None) -> list[tuple[Any, ...]]:
    with db.translate(settings), db.connect(settings) as conn:
        return list(conn.execute(ROWS, {"run": run_id}).fetchall())


def row_problems(directory: str, rows: Sequence[tuple[Any, ...]]) -> Iterator[str]:
    for url, final_url, filename, offset, length in rows:
        head, why = record_at(directory, filename, int(offset), int(length))
        if head is None:
            yield f"row {url}: {why}"
        elif head.target_uri != final_url:
            yield f"row {url}: the record at {filename}:{offset} is of {head.target_uri}"


def check(directory: str, rows: Sequence[tuple[Any, ...]]) -> list[str]:
    problems = [p for name in closed_files(directory) for p in file_problems(os.path.join(directory, name))]
    return problems + list(row_problems(directory, rows))


def run_index(directory: str, rows: Sequence[tuple[Any, ...]]) -> list[str]:
    """The run's CDXJ lines: its rows' records, and the responses their revisits name."""
    pages: list[RecordHead] = []
    for url, _final, filename, offset, length in rows:
        head, why = record_at(directory, filename, int(offset), int(length))
        if head is None:
            raise ConfigError(f"cdxj: row {url}: {why} (run `python -m ops.warc check`)")
        pages.append(head)
    originals: dict[str, RecordHead] = {}
    if any(page.kind == "revisit" for page in pages):
        for name in closed_files(directory) + open_files(directory):
            for head in heads(directory, name):
                if head.kind == "response":
                    originals[head.record_id] = head
    return list(cdxj.index_lines(pages, originals))


def _folder(value: str) -> str:
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a folder")
    return os.path.abspath(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.warc", description="Check and index the WARC files.")
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="each file whole, digests match, every row's record there")
    checking.add_argument("dir", type=_folder, help="the WARC_DIR the workers wrote")
    checking.add_argument("--run", metavar="ID", help="check the rows of this run only")
    indexing = commands.add_parser("cdxj", help="the CDXJ index of a run's records, for replay tools")
    indexing.add_argument("dir", type=_folder, help="the WARC_DIR the workers wrote")
    indexing.add_argument("--run", metavar="ID", required=True, help="the run to index")
    indexing.add_argument("--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "warc", settings.log_format)
    rows = page_rows(settings, args.run)
    if args.command == "check":
        problems = check(args.dir, rows)
        for problem in problems:
            print(problem)
        files = len(closed_files(args.dir))
        print(f"warc check: {files} files, {len(rows)} rows, {len(problems)} problems", file=sys.stderr)
        return 1 if problems else 0
    lines = run_index(args.dir, rows)
    text = "".join(f"{line}\n" for line in lines)
    if args.output is None:
        sys.stdout.write(text)
    else:
        partial = args.output.with_name(args.output.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(args.output)  # never a file that looks finished but is not
    print(f"warc cdxj: {len(lines)} lines for run {args.run}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main("warc", main)
