"""python -m bench.scrapy_playwright_run: scrapy-playwright rendering the same pages with the same
chromium, for bench/render_bench.py's side-by-side row.

    --urls FILE  --chromium PATH  --concurrency N  --out FILE

Each page is loaded with `wait_until="networkidle"`, as the renderer waits, and the fields our
renderer stores are extracted with bench/scrapy_run.py's `extract`. Prints one JSON object:
pages, elapsed_s. Needs the bench extra (scrapy, scrapy-playwright).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response

from bench.scrapy_run import extract


class RenderedPages(Spider):
    name = "rendered"

    def __init__(self, urls: list[str], out: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._urls = urls
        self._out = out
        self.pages = 0

    async def start(self) -> AsyncIterator[Request]:  # Scrapy 2.13 and later
        for request in self.start_requests():
            yield request

    def start_requests(self) -> Iterator[Request]:  # before 2.13
        for url in self._urls:
            yield Request(
                url,
                meta={"playwright": True, "playwright_page_goto_kwargs": {"wait_until": "networkidle"}},
            )

    def parse(self, response: Response) -> None:
        self.pages += 1
        self._out.write(json.dumps(extract(response)) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scrapy_playwright_run")
    parser.add_argument("--urls", required=True)
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.urls, encoding="utf-8") as listing:
        urls = [line.strip() for line in listing if line.strip()]
    process = CrawlerProcess(
        {
            "LOG_LEVEL": "WARNING",
            "TELNETCONSOLE_ENABLED": False,
            "ROBOTSTXT_OBEY": False,
            "CONCURRENT_REQUESTS": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
            "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
            "DOWNLOAD_HANDLERS": {
                "http": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
                "https": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
            },
            "PLAYWRIGHT_BROWSER_TYPE": "chromium",
            "PLAYWRIGHT_LAUNCH_OPTIONS": {
                "executable_path": args.chromium,
                "args": ["--disable-dev-shm-usage"],
                "headless": True,
            },
            "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": args.concurrency,
        }
    )
    finished: dict[str, float] = {}
    with open(args.out, "w", encoding="utf-8") as out:
        crawler = process.create_crawler(RenderedPages)
        crawler.signals.connect(
            lambda: finished.setdefault("at", time.monotonic()), signal=signals.spider_closed
        )
        started = time.monotonic()
        process.crawl(crawler, urls=urls, out=out)
        process.start()
    pages = crawler.stats.get_value("response_received_count", 0) if crawler.stats else 0
    print(json.dumps({"pages": pages, "elapsed_s": round(finished.get("at", time.monotonic()) - started, 2)}))


if __name__ == "__main__":
    main()
