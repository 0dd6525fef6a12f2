"""python -m ops.submit: hand a crawl to the running pipeline, from any machine that reaches
RabbitMQ, without a shell where the producer runs.

It builds a crawl request (shared/crawl_request.py), checks it (URLs, the address guard, the run
id, the size), and publishes it, persistent and confirmed, to the control queue
`<ns>.control.runs`; the producer service (`python -m producer --serve`, compose's `producer`)
seeds it. The run then shows in `ops.status` and `ops.runs` like any other. A bad request is a
one-line error (exit 2) and nothing is queued. The dashboard's `POST /api/v1/runs` calls
`submit()` with the request's body.

    python -m ops.submit --sitemap http://127.0.0.1:8000/sitemap.xml [--run-id demo-2]
    python -m ops.submit --url https://example.com/a --url https://example.com/b
    python -m ops.submit --site https://example.com/ --recrawl-of demo-1
    python -m ops.submit --json request.json          # or - for stdin: the API's body
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from producer.discovery_args import DiscoveryArgs, add_discovery_arguments
from shared.amqp import broker
from shared.amqp.topology import build_topology, control_queue
from shared.cli import configure_logging, run_main
from shared.crawl_request import MAX_REQUEST_BYTES, CrawlRequest, InvalidRequest, UrlCheck, check, new_run_id
from shared.errors import ServiceUnavailable
from shared.http.netguard import check_url
from shared.settings import Settings

# Publishes an encoded request to the control queue, waiting for the broker's confirm.
Publish = Callable[[Settings, bytes], None]


@dataclass(frozen=True)
class Submitted:
    run_id: str
    operation: str  # the request's id, which the producer service logs as it seeds the run


def submit(
    settings: Settings,
    body: bytes | Mapping[str, Any],
    *,
    guard: UrlCheck | None = None,
    publish: Publish | None = None,
) -> Submitted:
    """Check the request in `body` (the JSON bytes as received, or already parsed) and queue
    it. Raises InvalidRequest (one line: answer 400) when it cannot be crawled, with nothing
    queued; ServiceUnavailable (answer 503) when RabbitMQ cannot be reached."""
    request = CrawlRequest.from_json(body, new_run_id)
    check(request, guard or check_url(settings))
    (publish or publish_request)(settings, request.encode())
    return Submitted(request.run_id, request.request_id)


def publish_request(settings: Settings, body: bytes) -> None:
    connection = broker.connect(settings, "submit")
    try:
        # The whole topology, as every service declares it: the request must find its queue
        # even before the producer service first started.
        broker.declare_topology(connection, build_topology(settings))
        channel = broker.confirm_channel(connection)
        broker.publish(channel, broker.Publication("", control_queue(settings.crawl_namespace), body))
    except broker.CONNECTION_ERRORS as exc:
        raise broker.unavailable(settings, exc) from None
    except broker.PublishFailed as exc:
        raise ServiceUnavailable(
            "RabbitMQ", settings.crawl_namespace, f"refused the request: {exc}"
        ) from None
    finally:
        if connection.is_open:
            connection.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-id", help="the run's name (default: date-time plus a random suffix)")
    parser.add_argument("--sitemap", action="append", default=[], metavar="URL", help="repeatable")
    parser.add_argument("--url", action="append", default=[], metavar="URL", help="a page URL (repeatable)")
    parser.add_argument(
        "--site", action="append", default=[], metavar="ROOT", help="a site root (repeatable)"
    )
    parser.add_argument("--recrawl-of", metavar="RUN", help="an earlier run: publish only what changed since")
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="the request as the API takes it, from a file or - for stdin (no other option then)",
    )
    add_discovery_arguments(parser)
    return parser.parse_args(argv)


def request_body(args: argparse.Namespace, stdin: IO[bytes]) -> bytes | dict[str, Any]:
    if args.json is None:
        fields = {"sitemaps": args.sitemap, "urls": args.url, "sites": args.site}
        body: dict[str, Any] = {name: urls for name, urls in fields.items() if urls}
        if args.run_id is not None:
            body["run_id"] = args.run_id
        if args.recrawl_of is not None:
            body["recrawl_of"] = args.recrawl_of
        discovery = DiscoveryArgs.from_namespace(args)
        if discovery.discovers:
            body.update(
                start_urls=list(discovery.start_urls),
                max_depth=discovery.max_depth,
                scope=discovery.scope,
                include=list(discovery.include),
                exclude=list(discovery.exclude),
                max_pages=discovery.max_pages,
                max_pages_per_host=discovery.max_pages_per_host,
            )
        return body
    if args.run_id or args.recrawl_of or args.sitemap or args.url or args.site or args.start:
        raise InvalidRequest("--json takes no other option: the request is all in the JSON")
    if args.json == "-":
        return stdin.read(MAX_REQUEST_BYTES + 1)
    try:
        with Path(args.json).open("rb") as handle:
            return handle.read(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        raise InvalidRequest(f"--json {args.json}: cannot read it ({exc.strerror})") from None


def main(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    args = parse_args(argv)
    settings = Settings.from_env()
    configure_logging(settings.log_level, "submit", settings.log_format)
    submitted = submit(settings, request_body(args, sys.stdin.buffer))
    print(json.dumps({"run_id": submitted.run_id, "operation": submitted.operation}), file=out)
    return 0


if __name__ == "__main__":
    run_main("submit", main)
