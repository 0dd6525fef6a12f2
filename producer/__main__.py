"""`python -m producer`: read sitemaps, sites and URL files; publish each new URL once."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from producer.discovery_args import DiscoveryArgs, add_discovery_arguments
from producer.final_scrape import ScrapeWatch, linger_until_scraped
from producer.frontier_service import serve as serve_frontier
from producer.seeding import mark_seeded, seeded_summary
from producer.serve import serve
from producer.service import Options, new_run_id, run
from shared.cli import configure_logging, run_main
from shared.errors import ConfigError
from shared.metrics import start_metrics_server
from shared.settings import Settings

log = logging.getLogger(__name__)

EXIT_PUBLISH_FAILED = 1
# Every sitemap given failed and no URL was read from anywhere: the run has nothing to crawl.
# A run where only some sitemaps failed exits 0: what could be read is being crawled, and the
# summary's sitemaps_failed (and a warning) name the others; with --strict it exits 3 too.
EXIT_NOTHING_READ = 3
# Stopped by a signal before every input was read: the summary of what was done is printed all
# the same, and the same --run-id resumes the run. 128 + the signal's number, as a shell reports
# a process the signal killed, so a Job or container stopped mid-run never looks succeeded.
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EXIT_TERMINATED = 143  # SIGTERM: `docker stop`, a k8s eviction or rollout


def parse_args(argv: Sequence[str] | None = None) -> Options:
    return options_from(build_parser().parse_args(argv))


def build_parser() -> argparse.ArgumentParser:
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
        "--once",
        action="store_true",
        help="with --run-id: if this run was seeded to the end before, print that summary and "
        "exit 0 without reading anything (for a container that may be started again)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when any sitemap could not be read, not only when none could "
        "(the URLs of those that were read are published all the same)",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="run as a service: seed each crawl request put in the control queue by "
        "python -m ops.submit or the dashboard, acking it once its run is seeded (no other option)",
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="run the frontier of discovery runs instead: follow the links workers send, until "
        "SIGTERM (python -m ops.crawl starts it)",
    )
    add_discovery_arguments(parser)
    return parser


def options_from(args: argparse.Namespace) -> Options:
    if args.serve:
        raise ConfigError("--serve takes no other option: each crawl request brings its own")
    if args.once and not args.run_id:
        raise ConfigError("--once: give the run a name with --run-id, or every start is a new run")
    return Options(
        run_id=args.run_id or new_run_id(),
        sitemaps=tuple(args.sitemap),
        sites=tuple(args.site),
        url_files=tuple(args.urls),
        routing_file=args.routing,
        recrawl_of=args.recrawl_of,
        once=args.once,
        strict=args.strict,
        discovery=DiscoveryArgs.from_namespace(args),
        frontier=args.frontier,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve and not any_option_but_serve(args):
        settings = Settings.from_env()
        configure_logging(settings.log_level, "producer", settings.log_format)
        return serve(settings)
    options = options_from(args)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "producer", settings.log_format)
    if options.frontier:
        return serve_frontier(settings)
    if options.once and (earlier := seeded_summary(settings, options.run_id)) is not None:
        log.info("run %s was seeded at %s: nothing to do", options.run_id, earlier.get("seeded_at"))
        print(json.dumps({**earlier, "already_seeded": True}), flush=True)
        return 0
    watch = ScrapeWatch()
    server = start_metrics_server(settings, registry=watch)
    result = run(settings, options)
    watch.arm()  # the figures are final: a scrape from now on, even before the summary, counts
    print(json.dumps(result), flush=True)
    code = exit_code(result, options.strict)
    if options.once and seeded_to_the_end(result, code):
        mark_seeded(settings, options.run_id, result)
    # A short run would otherwise exit before Prometheus ever read it; a stopped one was asked
    # to go now, and a signal during the wait ends it too.
    if server is not None and not result["interrupted"]:
        linger_until_scraped(watch, settings.metrics_port, settings.metrics_linger_s)
    return code


def any_option_but_serve(args: argparse.Namespace) -> bool:
    defaults = vars(build_parser().parse_args([]))
    return any(value != defaults[name] for name, value in vars(args).items() if name != "serve")


def seeded_to_the_end(result: dict[str, Any], code: int) -> bool:
    """Every input read and every URL settled: a failed sitemap leaves the run unseeded, so the
    next `--once` start reads it again (dedup keeps the URLs already published from going twice)."""
    return (
        code == 0
        and not result["stopped_early"]
        and not result["left_claimed"]
        and not result["sitemaps_failed"]
    )


def exit_code(result: dict[str, Any], strict: bool = False) -> int:
    """1 for a failed publish (it wins over a stop: the run lost URLs, not only time), then 143
    or 130 for a stop by SIGTERM or Ctrl-C, then 3 for sitemaps that could not be read. A run
    that left URLs unread or claimed never exits 0, whatever stopped it."""
    failed = result["sitemaps_failed"]
    if result["publish_failed"]:
        return EXIT_PUBLISH_FAILED
    if result.get("stop_signal") == "SIGTERM":
        return EXIT_TERMINATED
    if result["interrupted"] or result.get("stopped_early") or result.get("left_claimed"):
        return EXIT_INTERRUPTED
    if failed and result["urls_seen"] == 0:
        log.error(
            "run %s: no sitemap could be read (%d failed), nothing to crawl", result["run_id"], len(failed)
        )
        return EXIT_NOTHING_READ
    if failed and strict:
        log.error("run %s: %d sitemaps could not be read (--strict)", result["run_id"], len(failed))
        return EXIT_NOTHING_READ
    if failed:
        log.warning(
            "run %s: %d sitemaps could not be read; the URLs of the others are queued",
            result["run_id"],
            len(failed),
        )
    return 0


if __name__ == "__main__":
    run_main("producer", lambda: main(sys.argv[1:]))
