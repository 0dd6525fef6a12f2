"""A site that refuses (429, no Retry-After) any request beyond a rate it keeps to itself, and
what a crawl of it settles at: the figure behind docs/POLITENESS.md, "Adaptive slow-down".

    python -m bench.secret_rate [--secret-rps 10] [--configured-rps 25] [--pages 300] [--workers 2]

It crawls the site with `python -m ops.crawl` (RATE_LIMIT_RPS set well above the secret rate)
and prints the secret rate, the rate of answered requests over the last half of the crawl, and
the share of requests refused. The site counts the requests it answered in the last second;
one more than the secret rate allows is refused. Uses the local services, under names of its
own, removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

from bench.site import Answer, Hit, LoggedSite, page

WINDOW_S = 1.0


class SecretRate:
    """The route: robots.txt, and pages answered while fewer than `rps` were answered in the
    last second; refused with 429 otherwise. Refused requests do not count against the rate."""

    def __init__(self, rps: float) -> None:
        self.rps = rps
        self._answered: deque[float] = deque()
        self._lock = threading.Lock()
        self.refused: list[float] = []
        self.served: list[float] = []

    def __call__(self, hit: Hit) -> Answer:
        if hit.path == "/robots.txt":
            return Answer(200, b"User-agent: *\nAllow: /\n", {"Content-Type": "text/plain"})
        with self._lock:
            while self._answered and self._answered[0] <= hit.at - WINDOW_S:
                self._answered.popleft()
            if len(self._answered) >= self.rps:
                self.refused.append(hit.at)
                return Answer(429, b"slow down", {"Content-Type": "text/plain"})
            self._answered.append(hit.at)
            self.served.append(hit.at)
        return page(hit.path)


@dataclass(frozen=True)
class Figures:
    secret_rps: float
    settled_rps: float  # pages answered a second over the last half of the crawl
    refused_share: float  # of all page requests
    requests: int
    refused: int

    def line(self) -> str:
        return (
            f"secret rate {self.secret_rps:g}/s, settled at {self.settled_rps:.2f}/s, "
            f"{self.refused} of {self.requests} requests refused ({self.refused_share:.1%})"
        )


def figures(route: SecretRate) -> Figures:
    served = sorted(route.served)
    requests = len(served) + len(route.refused)
    if len(served) < 4:
        return Figures(route.rps, 0.0, len(route.refused) / max(1, requests), requests, len(route.refused))
    half = served[len(served) // 2 :]
    settled = (len(half) - 1) / max(1e-9, half[-1] - half[0])
    return Figures(route.rps, settled, len(route.refused) / requests, requests, len(route.refused))


def crawl(route: SecretRate, pages: int, env: dict[str, str], workers: int, timeout_s: float) -> None:
    """Crawl `pages` pages of a LoggedSite served with `route`, through ops.crawl."""
    with LoggedSite(route) as site, tempfile.TemporaryDirectory() as scratch:
        urls = os.path.join(scratch, "urls.txt")
        with open(urls, "w", encoding="utf-8") as file:
            file.writelines(f"{site.url(f'/p/{n}')}\n" for n in range(pages))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ops.crawl",
                "--urls",
                urls,
                "--workers",
                str(workers),
                "--log-dir",
                os.path.join(scratch, "log"),
                "--timeout",
                str(timeout_s),
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=timeout_s + 30,
        )


def crawl_env(name: str, configured_rps: float, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "RATE_LIMIT_RPS": str(configured_rps),
        "FETCH_ALLOWLIST": "127.0.0.0/8",
        "RESPECT_ROBOTS": "true",
        "RETRY_DELAYS_S": "0.5,1",
        "MAX_ATTEMPTS": "5",
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.secret_rate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--secret-rps", type=float, default=10.0)
    parser.add_argument("--configured-rps", type=float, default=25.0)
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--recovery-s", type=float, default=60.0, help="RATE_RECOVERY_S of the crawl")
    args = parser.parse_args(argv)
    from ops.teardown import remove_pipeline
    from shared.settings import Settings

    name = f"bsr{uuid.uuid4().hex[:8]}"
    env = crawl_env(name, args.configured_rps, RATE_RECOVERY_S=str(args.recovery_s))
    route = SecretRate(args.secret_rps)
    started = time.monotonic()
    try:
        crawl(route, args.pages, env, args.workers, timeout_s=600)
    finally:
        remove_pipeline(Settings.from_env(env))
    print(f"{figures(route).line()}; {args.pages} pages in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
