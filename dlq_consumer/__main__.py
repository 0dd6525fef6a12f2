"""python -m dlq_consumer [consume | list | replay | purge] — see --help."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from dlq_consumer import store
from dlq_consumer.replay import replay
from dlq_consumer.service import SERVICE_NAME, consume
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.cli import configure_logging, run_main
from shared.postgres import db
from shared.settings import Settings

EXIT_NOTHING_DONE = 1
TABLE_COLUMNS = ("id", "run_id", "state", "reason", "attempts", "replays", "http_status", "url")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dlq_consumer",
        description="Store dead-lettered URLs in PostgreSQL, list them, replay them, purge them. "
        "Settings come from the environment (AMQP_URL, DATABASE_URL, CRAWL_NAMESPACE, PG_SCHEMA).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("consume", help="record every dead-lettered message (the default)")

    listing = commands.add_parser("list", help="show stored dead letters")
    _add_filters(listing, default_state="dead")
    listing.add_argument("--limit", type=_positive, default=100, help="at most N rows (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")

    replaying = commands.add_parser(
        "replay", help="send dead letters back to their work queue with a fresh attempt count"
    )
    _add_filters(replaying, default_state=None)
    replaying.add_argument("--limit", type=_positive, help="at most N rows (default: all)")
    replaying.add_argument("--dry-run", action="store_true", help="only count what would go")

    purging = commands.add_parser("purge", help="delete stored dead letters")
    _add_filters(purging, default_state="all")
    purging.add_argument("--yes", action="store_true", help="really delete (otherwise only count)")
    return parser


def _add_filters(parser: argparse.ArgumentParser, default_state: store.State | None) -> None:
    parser.add_argument("--run", metavar="ID", help="only this run id")
    parser.add_argument("--reason", metavar="R", help="only this reason (e.g. http_404, expired)")
    if default_state is not None:  # replay only ever takes rows that are still dead
        parser.add_argument(
            "--state",
            choices=store.STATES,
            default=default_state,
            help=f"rows in this state (default {default_state})",
        )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _selection(args: argparse.Namespace) -> store.Selection:
    return store.Selection(
        run_id=args.run,
        reason=args.reason,
        state=getattr(args, "state", "dead"),
        limit=getattr(args, "limit", None),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, SERVICE_NAME, settings.log_format, settings.worker_id)
    command = args.command or "consume"
    if command == "consume":
        return consume(settings)
    db.ensure_schema(settings)
    with db.translate(settings), db.connect(settings) as conn:
        if command == "list":
            return list_rows(conn, _selection(args), as_json=args.json)
        if command == "replay":
            return replay_rows(settings, conn, _selection(args), dry_run=args.dry_run)
        return purge_rows(conn, _selection(args), confirmed=args.yes)


def list_rows(conn: store.Connection, selection: store.Selection, *, as_json: bool) -> int:
    rows = store.select_rows(conn, selection)
    if as_json:
        for row in rows:
            print(json.dumps(row.summary(), separators=(",", ":")))
        return 0
    print(_table([TABLE_COLUMNS, *([str(_cell(r.summary()[c])) for c in TABLE_COLUMNS] for r in rows)]))
    print(f"{len(rows)} rows")
    return 0


def replay_rows(
    settings: Settings, conn: store.Connection, selection: store.Selection, *, dry_run: bool
) -> int:
    if dry_run:
        dead = store.count(conn, selection)
        would = dead if selection.limit is None else min(dead, selection.limit)
        print(f"would replay {would} dead letters")
        return 0
    connection = broker.connect(settings, f"{SERVICE_NAME} replay")
    try:
        # Declaring is idempotent, and makes sure the work exchange exists to route to.
        broker.declare_topology(connection, build_topology(settings))
        channel = broker.confirm_channel(connection)
        result = replay(
            conn,
            lambda publication: broker.publish(channel, publication),
            selection,
            settings.crawl_namespace,
        )
    except broker.PublishFailed as exc:
        print(f"{SERVICE_NAME}: error: the broker refused a replayed message: {exc}", file=sys.stderr)
        return EXIT_NOTHING_DONE
    except broker.CONNECTION_ERRORS as exc:
        raise broker.unavailable(settings, exc) from None
    finally:
        if connection.is_open:
            connection.close()
    skipped = f" ({result.skipped} skipped: body is not a task)" if result.skipped else ""
    print(f"replayed {result.replayed} dead letters{skipped}")
    return 0


def purge_rows(conn: store.Connection, selection: store.Selection, *, confirmed: bool) -> int:
    if not confirmed:
        print(f"would delete {store.count(conn, selection)} dead letters; add --yes to delete them")
        return EXIT_NOTHING_DONE
    deleted = store.delete(conn, selection)
    conn.commit()
    print(f"deleted {deleted} dead letters")
    return 0


def _cell(value: Any) -> Any:
    return "" if value is None else value


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


if __name__ == "__main__":
    run_main(SERVICE_NAME, main)
