"""A small, fast local site for the fault scenarios: every answer is decided by the path alone.

    /robots.txt               allows everything
    /sitemap_index.xml        lists /sitemaps/<n>.xml, each answered after `sitemap_delay_s`
    /pages/<n>.html           200, a small HTML page (bulk queue)
    /news/<n>.html            200 (the default routing rules send news to the ttl queue)
    /always500/<n>.html       500, every time
    /charset-trap/<n>.html    200 labelled charset=utf-7, whose text decodes to a lone surrogate:
                              the HTML parser cannot encode it and raises (a parse_error)
    /charset-lie/<n>.html     200 labelled charset=base64, a codec that is not a text encoding
    /hang/<n>.html            answers only when released, or after `hang_s`
    /shell/<n>.html           200, a page whose text a script builds: an empty root element and a
                              script, which RENDER=auto sends to the renderer (docs/RENDERING.md)

Every request is counted by path, so a test can tell how often a URL was fetched. The servers
speak HTTP/1.1 with keep-alive, as real sites do, so thousands of fetches stay cheap.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from tests.local_site import LocalServer, LocalSite, QuietHandler

HTML = "text/html; charset=utf-8"
PAGE = (
    "<!DOCTYPE html><html lang='en'><head><title>{path}</title></head>"
    "<body><h1>{path}</h1><p>{filler}</p><a href='/pages/1.html'>home</a></body></html>"
)
SCRIPT_SHELL = (
    "<!DOCTYPE html><html><head><title>{path}</title></head><body><div id='root'></div>"
    "<script>document.getElementById('root').innerHTML = '<h1>{path}</h1>'"
    " + '<p>' + 'built by a script '.repeat(20) + '</p>';</script></body></html>"
)
# '+2AA-' is UTF-7 for U+D800, a surrogate that no UTF encoder accepts.
CHARSET_TRAP = b"<html><head><title>trap +2AA-</title></head><body>+2AA-</body></html>"
FIXED_ANSWERS = {
    "always500": (500, "text/plain", b"always broken\n"),
    "charset-trap": (200, "text/html; charset=utf-7", CHARSET_TRAP),
    "charset-lie": (200, "text/html; charset=base64", b"<html><title>lie</title></html>"),
}


@dataclass(frozen=True)
class SiteShape:
    """How many URLs of each kind the site lists in its sitemaps."""

    pages: int = 100
    news: int = 0
    always_500: int = 0
    charset_traps: int = 0
    charset_lies: int = 0
    hangs: int = 0
    script_shells: int = 0
    urls_per_sitemap: int = 500
    sitemap_delay_s: float = 0.0  # per child sitemap: spreads publishing over time
    page_delay_s: float = 0.0  # per page: keeps fetches in flight longer
    hang_s: float = 120.0

    @classmethod
    def slow(cls, urls: int) -> SiteShape:
        """Twenty slow sitemaps and slow pages: a fault that comes mid-run finds the producer
        still publishing and the workers in the middle of their messages."""
        return cls(pages=urls, urls_per_sitemap=urls // 20, sitemap_delay_s=0.25, page_delay_s=0.05)

    def paths(self) -> list[str]:
        kinds = (
            ("pages", self.pages),
            ("news", self.news),
            ("always500", self.always_500),
            ("charset-trap", self.charset_traps),
            ("charset-lie", self.charset_lies),
            ("hang", self.hangs),
            ("shell", self.script_shells),
        )
        return [f"/{kind}/{n}.html" for kind, count in kinds for n in range(1, count + 1)]


class _Handler(QuietHandler):
    server: LocalServer[FaultSite]

    def do_GET(self) -> None:
        self.send(*self.server.site.answer(self.path.split("?")[0]))


class FaultSite(LocalSite):
    handler = _Handler

    def __init__(self, shape: SiteShape) -> None:
        super().__init__()
        self.shape = shape
        self._paths = shape.paths()
        self._known = frozenset(self._paths)
        self._hits: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._released = threading.Event()

    def urls(self, kind: str = "") -> list[str]:
        """Every listed URL, or those of one kind (the first path segment)."""
        return [self.url(p) for p in self._paths if not kind or p.startswith(f"/{kind}/")]

    @property
    def sitemap_index(self) -> str:
        return self.url("/sitemap_index.xml")

    def hits(self, path: str) -> int:
        with self._lock:
            return self._hits[path]

    def page_hits(self) -> collections.Counter[str]:
        """Requests per listed URL path (robots.txt and sitemaps left out)."""
        with self._lock:
            return collections.Counter({p: n for p, n in self._hits.items() if p.endswith(".html")})

    def release_hangs(self) -> None:
        self._released.set()

    def stop(self) -> None:
        self.release_hangs()
        super().stop()

    # ---- answers ------------------------------------------------------------------------

    def answer(self, path: str) -> tuple[int, str, bytes]:
        with self._lock:
            self._hits[path] += 1
        if path == "/robots.txt":
            return 200, "text/plain", b"User-agent: *\nAllow: /\n"
        if path == "/sitemap_index.xml":
            return 200, "application/xml", self._index()
        if path.startswith("/sitemaps/"):
            self._released.wait(self.shape.sitemap_delay_s)
            return 200, "application/xml", self._child(int(path.split("/")[-1].split(".")[0]))
        if path not in self._known:
            return 404, "text/plain", b"not found\n"
        kind = path.split("/")[1]
        if kind == "hang":
            self._released.wait(self.shape.hang_s)
        elif self.shape.page_delay_s:
            threading.Event().wait(self.shape.page_delay_s)
        if kind in FIXED_ANSWERS:
            return FIXED_ANSWERS[kind]
        if kind == "shell":
            return 200, HTML, SCRIPT_SHELL.format(path=path).encode()
        return 200, HTML, PAGE.format(path=path, filler="lorem ipsum " * 20).encode()

    def _index(self) -> bytes:
        count = -(-len(self._paths) // self.shape.urls_per_sitemap)
        items = "".join(
            f"<sitemap><loc>{self.url(f'/sitemaps/{n}.xml')}</loc></sitemap>" for n in range(count)
        )
        return _xml("sitemapindex", items)

    def _child(self, number: int) -> bytes:
        size = self.shape.urls_per_sitemap
        chunk = self._paths[number * size : (number + 1) * size]
        return _xml("urlset", "".join(f"<url><loc>{self.url(p)}</loc></url>" for p in chunk))


def _xml(root: str, items: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f'<{root} xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{items}</{root}>'
    ).encode()


def links_of(page: int, pages: int) -> list[int]:
    """A binary tree (every page reachable, depth about log2 of the pages), with links back to
    the parent and the root and one far link: most links a page has were seen already."""
    return [n for n in (2 * page + 1, 2 * page + 2, page // 2, 0, (page * 7919) % pages) if n < pages]


class _GraphHandler(QuietHandler):
    def do_GET(self) -> None:
        site: GraphSite = self.server.site
        if self.path == "/robots.txt":
            self.send(200, "text/plain", b"User-agent: *\nAllow: /\n")
            return
        try:
            page = int(self.path.removeprefix("/p/"))
        except ValueError:
            page = -1
        if not 0 <= page < site.pages:
            self.send(404, "text/html", b"<html></html>")
            return
        time.sleep(0.005)  # keeps fetches in flight, so kills land mid-fetch as well
        anchors = "".join(f"<a href='/p/{n}'>{n}</a> " for n in links_of(page, site.pages))
        self.send(
            200,
            "text/html",
            f"<html><head><title>{page}</title></head><body>{anchors}</body></html>".encode(),
        )


class GraphSite(LocalSite):
    """A site to crawl by discovery: /p/0 to /p/<pages - 1>, linked by links_of(); no sitemap."""

    handler: ClassVar[type[QuietHandler]] = _GraphHandler

    def __init__(self, pages: int) -> None:
        super().__init__()
        self.pages = pages
