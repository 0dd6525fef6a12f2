"""Which answer a request gets. No sockets here: the HTTP handler only carries the answer out,
so the site's behaviour can be read (and tested) as one function."""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

from demo_site import pages, sitemaps
from demo_site.config import SITEMAP_INDEX_PATH, Kind, SiteConfig
from demo_site.state import SiteState

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
XML = "application/xml"
# Served as a file, not as a compressed transfer: no Content-Encoding, the body is raw gzip bytes.
GZIP = "application/gzip"
FIX_PATH = "/__control/fix"
RESET_PATH = "/__control/reset"
PAGE_PATH = re.compile(r"/(?P<kind>[a-z]+)/(?P<number>[0-9]+)\.html")


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    delay_s: float = 0.0  # how long to wait before answering


def text(status: HTTPStatus, message: str) -> Answer:
    return Answer(status, TEXT, (message + "\n").encode("utf-8"))


NOT_FOUND = text(HTTPStatus.NOT_FOUND, "not found")


def answer(config: SiteConfig, state: SiteState, site: int, method: str, target: str) -> Answer:
    """The answer to `method target` sent to site host number `site`."""
    path = urlsplit(target).path
    if method == "POST":
        return _control(state, path)
    if method not in ("GET", "HEAD"):
        return NOT_FOUND
    if path == "/robots.txt":
        return Answer(HTTPStatus.OK, TEXT, pages.robots_txt(config, site))
    if site == 0:
        sitemap = _sitemap(config, path)
        if sitemap is not None:
            return sitemap
    match = PAGE_PATH.fullmatch(path)
    if match is None:
        return NOT_FOUND
    try:
        kind = Kind(match["kind"])
    except ValueError:
        return NOT_FOUND
    number = int(match["number"])
    if not 1 <= number <= config.count(kind):
        return NOT_FOUND
    result = _page(config, state, site, kind, number)
    return Answer(result.status, result.content_type, result.body, config.slow_ms / 1000)


def _control(state: SiteState, path: str) -> Answer:
    if path == FIX_PATH:
        state.fix()
        return text(HTTPStatus.OK, "fixed: broken pages answer 200 from now on")
    if path == RESET_PATH:
        state.reset()
        return text(HTTPStatus.OK, "reset: request counts cleared, broken pages broken again")
    return NOT_FOUND


def _sitemap(config: SiteConfig, path: str) -> Answer | None:
    if path == SITEMAP_INDEX_PATH:
        return Answer(HTTPStatus.OK, XML, sitemaps.index_xml(config))
    if path == sitemaps.PLAIN_CHILD_PATH:
        return Answer(HTTPStatus.OK, XML, sitemaps.urlset_xml(config, 0))
    if path == sitemaps.GZIP_CHILD_PATH:
        return Answer(HTTPStatus.OK, GZIP, sitemaps.gzipped_urlset(config, 1))
    return None


def _page(config: SiteConfig, state: SiteState, site: int, kind: Kind, number: int) -> Answer:
    if kind is Kind.MISSING:
        return NOT_FOUND
    if kind is Kind.FLAKY:
        hits = state.count_hit(config.netloc(site), config.path(kind, number))
        if hits <= config.flaky_failures:
            return text(HTTPStatus.INTERNAL_SERVER_ERROR, f"flaky failure {hits}")
    if kind is Kind.BROKEN and not state.fixed:
        return text(HTTPStatus.INTERNAL_SERVER_ERROR, "broken until fixed")
    return Answer(HTTPStatus.OK, HTML, pages.render_page(config, site, kind, number))
