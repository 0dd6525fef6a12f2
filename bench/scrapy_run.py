"""python -m bench.scrapy_run: the reference crawl, Scrapy doing the same extraction as our workers.

    --urls FILE      crawl a list of URLs (latency-bound benchmark)
    --sitemap URL    crawl what a sitemap index lists, with SitemapSpider (CPU-bound benchmark)
    --start URL --max-depth N
                     follow links from URL within its host to depth N, with CrawlSpider,
                     LinkExtractor, allowed_domains and DEPTH_LIMIT (discovery benchmark)

Writes JSON lines to --out and prints one JSON object: pages, elapsed_s (the crawl alone),
finished_at (time.monotonic() when the crawl ended, a clock all processes share), cpu_s (this
process, start-up included), crawl_cpu_s (from the engine's start: imports and set-up left out)
and peak_rss_mb. `--delay S` spaces the requests to each domain S seconds apart
(DOWNLOAD_DELAY, not randomised): Scrapy's way of crawling politely.
Needs the bench extra (`pip install -e '.[bench]'`); nothing else in the project imports it.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request, Spider, signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import default_settings
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider

# Requests exactly DOWNLOAD_DELAY apart, as our limiter spaces them; newer Scrapy renamed the setting.
NO_DELAY_JITTER = (
    {"DOWNLOAD_DELAY_JITTER": 0}
    if hasattr(default_settings, "DOWNLOAD_DELAY_JITTER")
    else {"RANDOMIZE_DOWNLOAD_DELAY": False}
)
VISIBLE_TEXT = "//body//text()[not(ancestor::script or ancestor::style or ancestor::noscript)]"


def extract(response: Response) -> dict[str, Any]:
    """The fields our worker stores, extracted the way a Scrapy user would."""
    text = " ".join(" ".join(response.xpath(VISIBLE_TEXT).getall()).split())
    links = []
    seen = set()
    for href in response.css("a::attr(href)").getall():
        url = response.urljoin(href).split("#")[0]
        if url.startswith(("http://", "https://")) and url not in seen:
            seen.add(url)
            links.append(url)
    return {
        "url": response.url,
        "status": response.status,
        "title": (response.css("title::text").get() or "").strip() or None,
        "meta_description": response.css('meta[name="description"]::attr(content)').get(),
        "canonical_url": response.css('link[rel="canonical"]::attr(href)').get(),
        "lang": response.css("html::attr(lang)").get(),
        "h1": " ".join(response.css("h1 ::text").getall() or [""]).strip() or None,
        "text": text,
        "links": links,
    }


class UrlListSpider(Spider):
    name = "url_list"

    def __init__(self, urls_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls_file = urls_file

    async def start(self) -> Any:
        with open(self.urls_file) as lines:
            for line in lines:
                if line.strip():
                    yield Request(line.strip(), callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield extract(response)


class IndexSpider(SitemapSpider):
    name = "sitemap"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield extract(response)


class LinkSpider(CrawlSpider):
    """A discovery crawl as a Scrapy user writes one: every link of the start URL's host."""

    name = "links"

    def __init__(self, start_url: str, **kwargs: Any) -> None:
        # allowed_domains takes a host without its port; LinkExtractor's allow_domains compares
        # the whole netloc, so host:port there keeps to our `host` scope (host and port).
        parts = urlsplit(start_url)
        self.start_url = start_url
        self.allowed_domains = [parts.hostname or ""]
        # deny_extensions=[]: our workers follow a link whatever its path ends with, and Scrapy's
        # default list (about 100 endings, each tried on every link) would cost it a check we skip.
        self.rules = (
            Rule(
                LinkExtractor(allow_domains=[parts.netloc], deny_extensions=[]),
                callback="parse_item",
                follow=True,
            ),
        )
        super().__init__(**kwargs)

    async def start(self) -> Any:
        # Filtered like every other request (start URLs are not, by default): a link back to
        # the start page would otherwise fetch it a second time.
        yield Request(self.start_url)

    def parse_start_url(self, response: Response, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield extract(response)

    def parse_item(self, response: Response) -> Iterator[dict[str, Any]]:
        yield extract(response)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scrapy_run")
    parser.add_argument("--urls")
    parser.add_argument("--sitemap")
    parser.add_argument("--start")
    parser.add_argument("--max-depth", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--per-domain", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.0, help="DOWNLOAD_DELAY, seconds (default 0)")
    args = parser.parse_args(argv)
    process = CrawlerProcess(
        {
            "CONCURRENT_REQUESTS": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.per_domain,
            "ROBOTSTXT_OBEY": True,
            "LOG_LEVEL": "WARNING",
            "TELNETCONSOLE_ENABLED": False,
            "FEEDS": {args.out: {"format": "jsonlines", "overwrite": True}},
            "COOKIES_ENABLED": False,
            "DOWNLOAD_DELAY": args.delay,
            **NO_DELAY_JITTER,
            # Only with --start: Scrapy's 0 means no limit. Breadth first, as our queues are FIFO:
            # Scrapy's default order is last in, first out, so a page could first be reached by
            # a longer path, cut at DEPTH_LIMIT, and its shorter path then dropped as a duplicate;
            # which pages a crawl reached then depended on timing (1,225 in one run, 1,027 in
            # the next, of the same site). DEPTH_PRIORITY=1 with FIFO queues is the order
            # Scrapy's FAQ gives for a breadth-first crawl.
            **(
                {
                    "DEPTH_LIMIT": args.max_depth,
                    "DEPTH_PRIORITY": 1,
                    "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
                    "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
                }
                if args.start
                else {}
            ),
        }
    )
    spider = UrlListSpider if args.urls else LinkSpider if args.start else IndexSpider
    crawler = process.create_crawler(spider)
    cpu_at_engine_start: list[float] = []

    def engine_started() -> None:  # a named function: Scrapy's signals hold their receivers weakly
        cpu_at_engine_start.append(cpu_s())

    crawler.signals.connect(engine_started, signal=signals.engine_started)
    if args.urls:
        process.crawl(crawler, urls_file=args.urls)
    elif args.start:
        process.crawl(crawler, start_url=args.start)
    else:
        process.crawl(crawler, sitemap_urls=[args.sitemap])
    started = time.monotonic()
    process.start()
    finished_at = time.monotonic()
    elapsed = finished_at - started
    total_cpu_s = cpu_s()
    with open(args.out) as out:
        pages = sum(1 for _ in out)
    print(
        json.dumps(
            {
                "pages": pages,
                "elapsed_s": elapsed,
                "finished_at": finished_at,
                "cpu_s": total_cpu_s,
                # None if the engine never started (the crawl failed before it could)
                "crawl_cpu_s": total_cpu_s - cpu_at_engine_start[0] if cpu_at_engine_start else None,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
