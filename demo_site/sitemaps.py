"""The sitemap index and its two children: a plain XML urlset and a gzipped one.

The URLs of every host are split between the children, and a few entries spell an
already-listed URL differently (upper-case scheme or host, a fragment) so that a crawler's
canonicalisation and dedup have something to find. Invalid entries (ftp:// URLs) come last.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from xml.sax.saxutils import escape

from demo_site.config import Kind, SiteConfig

PLAIN_CHILD_PATH = "/sitemaps/pages.xml"
GZIP_CHILD_PATH = "/sitemaps/more.xml.gz"
CHILD_PATHS = (PLAIN_CHILD_PATH, GZIP_CHILD_PATH)
# Long ago, so that a "recently modified" rule never favours these pages: only the sitemap
# priority (and, for news, the URL) decides where they go. Priority pages carry no lastmod.
OLD_LASTMOD = "2015-06-01"
XMLNS = "http://www.sitemaps.org/schemas/sitemap/0.9"


@dataclass(frozen=True)
class Entry:
    loc: str
    priority: str
    lastmod: str  # empty: no <lastmod>
    child: int  # index into CHILD_PATHS


def entries(config: SiteConfig) -> list[Entry]:
    """Every <url> of both children, duplicates last."""
    listed: list[tuple[str, str, str]] = []
    for site in range(len(config.names)):
        for kind in Kind:
            for number in range(1, config.count(kind) + 1):
                is_priority = kind is Kind.PAGE and number <= config.priority_per_host
                listed.append(
                    (
                        config.url(site, kind, number),
                        "1.0" if is_priority else "0.5",
                        "" if is_priority else OLD_LASTMOD,
                    )
                )
    # Alternate the children so each holds URLs of every host and every kind.
    result = [Entry(loc, prio, mod, index % 2) for index, (loc, prio, mod) in enumerate(listed)]
    child_of = {entry.loc: entry.child for entry in result}
    for number in range(config.duplicate_entries):
        original = _duplicated_url(config, number)
        # In the other child, so dedup has to work across files and not only within one.
        other_child = 1 - child_of[original]
        result.append(Entry(_respell(config, number), "0.5", OLD_LASTMOD, other_child))
    for number in range(config.invalid_entries):
        netloc = config.netloc(number % len(config.names))
        result.append(Entry(f"ftp://{netloc}/files/{number + 1}.txt", "0.5", OLD_LASTMOD, number % 2))
    return result


def _duplicated_url(config: SiteConfig, number: int) -> str:
    """The canonical URL that duplicate entry `number` spells differently: round-robin by host."""
    site_count = len(config.names)
    return config.url(number % site_count, Kind.PAGE, number // site_count + 1)


def _respell(config: SiteConfig, number: int) -> str:
    site_count = len(config.names)
    site = number % site_count
    path = config.path(Kind.PAGE, number // site_count + 1)
    netloc = config.netloc(site)
    spellings = (
        f"HTTP://{netloc.upper()}{path}#top",
        f"http://{netloc}{path}#comments",
        f"HTTP://{netloc}{path}",
    )
    return spellings[number % len(spellings)]


def urlset_xml(config: SiteConfig, child: int) -> bytes:
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', f'<urlset xmlns="{XMLNS}">']
    for entry in entries(config):
        if entry.child != child:
            continue
        lastmod = f"<lastmod>{entry.lastmod}</lastmod>" if entry.lastmod else ""
        lines.append(
            f"  <url><loc>{escape(entry.loc)}</loc>{lastmod}<priority>{entry.priority}</priority></url>"
        )
    lines.append("</urlset>")
    return ("\n".join(lines) + "\n").encode("utf-8")


def gzipped_urlset(config: SiteConfig, child: int) -> bytes:
    # mtime=0 keeps the bytes identical from one request to the next.
    return gzip.compress(urlset_xml(config, child), mtime=0)


def index_xml(config: SiteConfig) -> bytes:
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', f'<sitemapindex xmlns="{XMLNS}">']
    for path in CHILD_PATHS:
        lines.append(f"  <sitemap><loc>{escape(config.origin(0) + path)}</loc></sitemap>")
    lines.append("</sitemapindex>")
    return ("\n".join(lines) + "\n").encode("utf-8")
