"""`python -m producer`: read sitemaps, sites and URL files; publish each new URL once."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from producer.exit_codes import exit_code
from producer.final_scrape import ScrapeWatch, linger_until_scraped
from producer.service import Options, new_run_id, run
from shared.cli import configure_logging, run_main
from shared.metrics import start_metrics_server
from shared.settings import Settings


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m producer",
        description="Read sitemaps (XML, gzip, plain text; indexes followed), sites' robots.txt "
        "and files of URLs; canonicalise and dedupe the URLs and publish each new one to its "
        "work queue. Prints a JSON summary on stdout; progress goes to stderr. Settings come "
        "from the environment (see .env.example).",
    )
    parser.add_argument(
        "--run-id",
        default=None,
        help="name of this run; dedup is per run, so repeating a run id resumes "
        "it without re-publishing (default: date-time plus a random suffix)",
    )
    parser.add_argument(
        "--sitemap",
        action="append",
        default=[],
        metavar="URL",
        help="a sitemap or sitemap index URL (repeatable)",
    )
    parser.add_argument(
        "--site",
        action="append",
        default=[],
        metavar="ROOT",
        help="a site root such as http://127.0.0.1:8000/: its robots.txt "
        "Sitemap: lines are read, else /sitemap.xml (repeatable)",
    )
    parser.add_argument(
        "--urls",
        action="append",
        default=[],
        metavar="FILE",
        help="a file of URLs, one per line, '#' starts a comment line (repeatable)",
    )
    parser.add_argument(
        "--routing", default="", metavar="FILE", help="routing rules (TOML); overrides ROUTING_FILE"
    )
    parser.add_argument(
        "--recrawl-of",
        default="",
        metavar="RUN_ID",
        help="an earlier run of the same site: URLs whose <lastmod> (or <changefreq>) says they "
        "have not changed since that run fetched them are not published again",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when any sitemap could not be read, not only when none could "
        "(the URLs of those that were read are published all the same)",
    )
    args = parser.parse_args(argv)
    return Options(
        run_id=args.run_id or new_run_id(),
        sitemaps=tuple(args.sitemap),
        sites=tuple(args.site),
        url_files=tuple(args.urls),
        routing_file=args.routing,
        recrawl_of=args.recrawl_of,
        strict=args.strict,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "producer", settings.log_format)
    watch = ScrapeWatch()
    server = start_metrics_server(settings, registry=watch)
    result = run(settings, options)
    watch.arm()  # the figures are final: a scrape from now on, even before the summary, counts
    print(json.dumps(result), flush=True)
    if server is not None:  # a short run would otherwise exit before Prometheus ever read it
        linger_until_scraped(watch, settings.metrics_port, settings.metrics_linger_s)
    return exit_code(result, options.strict)


if __name__ == "__main__":
    run_main("producer", lambda: main(sys.argv[1:]))
