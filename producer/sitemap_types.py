"""What reading a sitemap yields and how it fails: shared by the reader (producer/sitemaps.py)
and the XML parser (producer/sitemap_xml.py)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin

from shared.errors import PipelineError


@dataclass(slots=True)  # not frozen: made for every URL read, and frozen ones build slowly
class SitemapEntry:
    """A URL as a sitemap or URL file gave it (not yet canonical) with its hints."""

    url: str
    source: str
    lastmod: str | None = None
    priority: float | None = None
    changefreq: str | None = None


@dataclass(frozen=True)
class ChildSitemap:
    """A <sitemap><loc> of a sitemap index."""

    url: str


@dataclass(frozen=True)
class SitemapFailure:
    url: str
    error: str


class SitemapError(PipelineError):
    """Why one sitemap document cannot be (fully) read; `str()` is one line."""


def join_url(base: str, reference: str) -> str | None:
    """`reference` resolved against `base`, or None when it cannot be parsed ('http://[')."""
    try:
        return urljoin(base, reference)
    except ValueError:
        return None
