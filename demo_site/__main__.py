"""Run the demo site until SIGTERM or SIGINT: `python -m demo_site --help`.

The site stands in for the outside world, so it imports nothing from the pipeline's packages
(only `runner.py`, the bridge to the pipeline's launcher, does).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from demo_site.config import DEFAULT_HOSTS, DEFAULT_PORT, SiteConfig
from demo_site.server import DemoSite

EXIT_USER_ERROR = 2


def comma_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
    defaults = SiteConfig()
    parser = argparse.ArgumentParser(
        prog="python -m demo_site",
        description=(
            "Serve a generated demo website on several loopback addresses, one per host, with "
            "sitemaps, flaky, broken and missing pages. POST /__control/fix makes broken pages "
            "answer 200; POST /__control/reset restores the start state."
        ),
    )
    parser.add_argument(
        "--hosts",
        type=comma_list,
        default=DEFAULT_HOSTS,
        help=f"comma-separated listen addresses, one per host (default: {','.join(DEFAULT_HOSTS)})",
    )
    parser.add_argument(
        "--public-names",
        type=comma_list,
        default=(),
        help="comma-separated host names to use in URLs instead of --hosts, e.g. network aliases "
        "when one container listens on 0.0.0.0",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port for every host (default: {DEFAULT_PORT})"
    )
    counts = {
        "pages_per_host": "normal pages per host",
        "news_per_host": "news pages per host",
        "flaky_per_host": "pages per host failing with 500 before they answer 200",
        "broken_per_host": "pages per host answering 500 until fixed",
        "missing_per_host": "pages per host listed in the sitemaps but 404",
        "priority_per_host": "pages per host with sitemap priority 1.0",
        "duplicate_entries": "extra sitemap entries spelling a listed URL differently",
        "flaky_failures": "500 answers a flaky page gives first",
        "slow_ms": "milliseconds to wait before answering a page",
        "disallowed_per_host": "pages per host listed in the sitemaps but disallowed by robots.txt",
        "invalid_entries": "extra sitemap entries whose URL is not http(s), for a crawler to refuse",
    }
    for field, text in counts.items():
        parser.add_argument(
            "--" + field.replace("_", "-"),
            type=int,
            default=getattr(defaults, field),
            help=f"{text} (default: {getattr(defaults, field)})",
        )
    parser.add_argument("--log", metavar="FILE", help="append one JSON line per request to FILE")
    return parser


def config_from_args(args: argparse.Namespace) -> SiteConfig:
    return SiteConfig(
        hosts=args.hosts,
        port=args.port,
        public_names=args.public_names,
        pages_per_host=args.pages_per_host,
        news_per_host=args.news_per_host,
        flaky_per_host=args.flaky_per_host,
        broken_per_host=args.broken_per_host,
        missing_per_host=args.missing_per_host,
        priority_per_host=args.priority_per_host,
        duplicate_entries=args.duplicate_entries,
        flaky_failures=args.flaky_failures,
        slow_ms=args.slow_ms,
        disallowed_per_host=args.disallowed_per_host,
        invalid_entries=args.invalid_entries,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    site = DemoSite(config, log_path=args.log)
    try:
        site.start()
    except OSError as exc:
        print(
            f"demo site: error: cannot listen on {','.join(config.hosts)} port {config.port}: "
            f"{exc.strerror or exc} (addresses other than 127.0.0.1 may need a loopback alias "
            "on systems that do not route all of 127.0.0.0/8 to loopback)",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR

    stopping = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print(f"demo site: sitemap index at {site.config.sitemap_index_url}", flush=True)
    # A timed wait, so the main thread gets back to the interpreter to run the signal handler.
    while not stopping.wait(0.5):
        pass
    site.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
