"""CPU per page of the two steps every page takes, beside what Scrapy does for the same step.

- Parsing: our `parse_page` (BeautifulSoup on lxml) against the `extract` function of
  bench/scrapy_run.py (parsel on lxml), on the same benchmark page.
- Fetching: our Fetcher (requests, with the address guard) against a bare urllib3 pool, which
  requests is built on, for the same page over a kept-alive loopback connection.

Each is timed in one thread with `time.thread_time`, so the figures are CPU per call with no
other thread in the way: a floor under what a page costs in a busy worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import urllib3
from scrapy.http import HtmlResponse

from bench.scrapy_run import extract
from shared.http.netguard import check_url, guarded_session
from shared.settings import Settings
from worker.fetch.fetcher import Fetcher
from worker.parse.page import parse_page

CALLS = 2000


@dataclass(frozen=True)
class Floor:
    parse_ms: float  # our parse_page
    scrapy_parse_ms: float  # Scrapy's extraction, on a fresh response each time
    fetch_ms: float  # our Fetcher.fetch
    urllib3_fetch_ms: float  # the same GET through urllib3 alone


def cpu_ms_per_call(work: Callable[[], object], calls: int = CALLS) -> float:
    work()  # warm: connections, caches, lazy imports
    started = time.thread_time()
    for _ in range(calls):
        work()
    return 1000 * (time.thread_time() - started) / calls


def measure(page_url: str, settings: Settings) -> Floor:
    pool = urllib3.PoolManager()
    body = pool.request("GET", page_url).data
    session = guarded_session(settings)
    with Fetcher(settings, lambda: session, check_url(settings)) as fetcher:
        return Floor(
            parse_ms=cpu_ms_per_call(lambda: parse_page(body, page_url)),
            scrapy_parse_ms=cpu_ms_per_call(
                lambda: extract(HtmlResponse(url=page_url, body=body, encoding="utf-8"))
            ),
            fetch_ms=cpu_ms_per_call(lambda: fetcher.fetch(page_url)),
            urllib3_fetch_ms=cpu_ms_per_call(lambda: pool.request("GET", page_url).data),
        )
