"""The discovery flags, as `python -m producer` and `python -m ops.crawl` both take them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from producer.discovery_scope import DEFAULT_MAX_DEPTH, DEFAULT_MAX_PAGES, DEFAULT_SCOPE, SCOPES


@dataclass(frozen=True)
class DiscoveryArgs:
    """The flags as given; producer/discovery_scope.py checks them."""

    start_urls: tuple[str, ...] = ()
    max_depth: int | None = None
    scope: str = DEFAULT_SCOPE
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_pages: int = DEFAULT_MAX_PAGES
    max_pages_per_host: int = 0

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> DiscoveryArgs:
        return cls(
            start_urls=tuple(args.start),
            max_depth=args.max_depth,
            scope=args.scope,
            include=tuple(args.include),
            exclude=tuple(args.exclude),
            max_pages=args.max_pages,
            max_pages_per_host=args.max_pages_per_host,
        )

    def as_flags(self) -> list[str]:
        """The same, as flags again (ops.crawl hands them to the producer)."""
        flags = [item for url in self.start_urls for item in ("--start", url)]
        if self.max_depth is not None:
            flags += ["--max-depth", str(self.max_depth)]
        flags += ["--scope", self.scope, "--max-pages", str(self.max_pages)]
        flags += ["--max-pages-per-host", str(self.max_pages_per_host)]
        flags += [item for pattern in self.include for item in ("--include", pattern)]
        flags += [item for pattern in self.exclude for item in ("--exclude", pattern)]
        return flags

    @property
    def discovers(self) -> bool:
        return bool(self.start_urls) or self.max_depth is not None


def add_discovery_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "discovery",
        "follow links from start URLs (and sitemap URLs), which are depth 0; a run discovers "
        "when given --start or --max-depth",
    )
    group.add_argument("--start", action="append", default=[], metavar="URL", help="a start URL (repeatable)")
    group.add_argument(
        "--max-depth",
        type=int,
        default=None,
        metavar="N",
        help=f"links followed from a start URL at most (default {DEFAULT_MAX_DEPTH}; "
        "0: the start pages only)",
    )
    group.add_argument(
        "--scope",
        choices=SCOPES,
        default=DEFAULT_SCOPE,
        help="host: a start URL's host and port; domain: its host without 'www.' and every "
        "host under it; prefix: URLs that begin with a start URL's directory (default host)",
    )
    group.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="REGEX",
        help="follow only URLs one of these matches (repeatable)",
    )
    group.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="REGEX",
        help="never follow URLs these match (repeatable)",
    )
    group.add_argument(
        "--max-pages",
        type=int,
        default=DEFAULT_MAX_PAGES,
        metavar="N",
        help=f"URLs the run enqueues at most, sitemap URLs included (default {DEFAULT_MAX_PAGES:,}; "
        "0: no bound)",
    )
    group.add_argument(
        "--max-pages-per-host",
        type=int,
        default=0,
        metavar="N",
        help="URLs discovered and enqueued per host at most (default 0: no bound but --max-pages)",
    )
