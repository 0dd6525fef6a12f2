"""Where URLs come from: sitemaps, sites (via robots.txt) and files of URLs, as one stream."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from producer.sitemaps import SitemapEntry, SitemapReader
from shared.errors import ConfigError

log = logging.getLogger(__name__)

REQUEST_SOURCE = "request"  # the source of the URLs a crawl request names (shared/crawl_request.py)


def check_url_files(paths: Sequence[str]) -> None:
    """Fail before any work starts, not halfway through, when a URL file cannot be read."""
    for path in paths:
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"--urls {path}: cannot read it ({exc.strerror})") from None


def read_url_file(path: str) -> Iterator[SitemapEntry]:
    """One URL per line; blank lines and lines starting with '#' are skipped."""
    count = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for raw in handle:
            line = raw.strip()
            if line and not line.startswith("#"):
                count += 1
                yield SitemapEntry(url=line, source=path)
    log.info("read URL file %s: %d URLs", path, count)


def all_entries(
    reader: SitemapReader,
    sitemaps: Sequence[str] = (),
    sites: Sequence[str] = (),
    url_files: Sequence[str] = (),
    urls: Sequence[str] = (),
) -> Iterator[SitemapEntry]:
    """Every URL from every input, lazily: nothing is held but the current sitemap's parser.
    `urls`: page URLs given as they are (a crawl request's), their source named "request"."""
    for url in urls:
        yield SitemapEntry(url=url, source=REQUEST_SOURCE)
    for path in url_files:
        yield from read_url_file(path)
    for sitemap in sitemaps:
        yield from reader.read(sitemap)
    for site in sites:
        yield from reader.read_site(site)
