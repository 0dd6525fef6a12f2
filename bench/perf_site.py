"""python -m bench.perf_site: a fast local site for throughput benchmarks, in its own process.

One asyncio server per loopback address (127.0.1.1 and up, one per host), all on one port, with
HTTP/1.1 keep-alive. Every host serves the same generated pages (about 6 KB of HTML with a
title, description, canonical link, headings, paragraphs and 20 links) at /p/<n>.html,
/robots.txt allowing everything, and a sitemap index at /sitemap_index.xml whose gzipped
children list every page of every host. `--delay-ms` holds each page answer that long, to
model a remote site's latency without using any CPU while waiting.

`--root DIR` serves real pages instead: the first --pages-per-host HTML files of DIR (in
bench/real_corpus.py's order) on every host, at their paths under DIR, and the sitemaps list them.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

URLS_PER_SITEMAP = 5_000
WORDS = [
    "crawl",
    "queue",
    "broker",
    "worker",
    "page",
    "index",
    "sitemap",
    "domain",
    "limit",
    "cache",
    "result",
    "store",
    "retry",
    "letter",
    "dead",
    "route",
    "parse",
    "fetch",
    "header",
    "status",
    "priority",
    "bulk",
    "expiry",
    "confirm",
    "ack",
    "redelivery",
]


@dataclass(frozen=True)
class SiteSpec:
    hosts: int
    pages_per_host: int
    port: int
    delay_ms: int
    root: Path | None = None  # real pages from this directory instead of generated ones
    links_per_page: int = 20  # of a generated page (see page_html)
    real_paths: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of_directory(cls, root: Path, hosts: int, pages_per_host: int, port: int, delay_ms: int) -> SiteSpec:
        from bench.real_corpus import page_paths

        paths = tuple(page_paths(root)[:pages_per_host])
        return cls(hosts, len(paths), port, delay_ms, root, real_paths=paths)

    def host(self, index: int) -> str:
        return f"127.0.1.{index + 1}"

    def origin(self, index: int) -> str:
        return f"http://{self.host(index)}:{self.port}"

    def page_urls(self) -> list[str]:
        if self.root:
            return [f"{self.origin(h)}{p}" for h in range(self.hosts) for p in self.real_paths]
        return [f"{self.origin(h)}/p/{n}.html" for h in range(self.hosts) for n in range(self.pages_per_host)]


def link_targets(n: int, pages: int, links: int = 20) -> list[int]:
    """The pages page `n` links to. 20 (the default): n + 37k, which a crawl from a sitemap
    never follows. Any other number, for discovery crawls: half of them to the next level of a
    tree (page n's children n * half + k: every page reachable from page 0, in few levels, as a
    site's navigation makes it), the other half across the site, mostly to pages seen already."""
    if links == 20:
        return [(n + k * 37) % pages for k in range(1, 21)]
    half = links // 2
    return [(n * half + k) % pages for k in range(1, half + 1)] + [
        (n + k * 37) % pages for k in range(1, links - half + 1)
    ]


def page_html(origin: str, n: int, pages: int, links_per_page: int = 20) -> bytes:
    words = [WORDS[(n * 7 + i * 3) % len(WORDS)] for i in range(900)]
    paragraphs = "".join(f"<p>{' '.join(words[i : i + 60])}</p>" for i in range(0, len(words), 60))
    links = "".join(
        f'<li><a href="/p/{target}.html">page {k}</a></li>'
        for k, target in enumerate(link_targets(n, pages, links_per_page), start=1)
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Page {n}</title>'
        f'<meta name="description" content="Benchmark page number {n}">'
        f'<link rel="canonical" href="{origin}/p/{n}.html"><style>p{{margin:0}}</style></head>'
        f"<body><header><h1>Page {n}</h1></header><main>{paragraphs}</main>"
        f"<nav><ul>{links}</ul></nav><script>var n={n};</script></body></html>"
    ).encode()


def sitemap_files(spec: SiteSpec) -> dict[str, bytes]:
    """Paths on the first host: the index and its gzipped children."""
    urls = spec.page_urls()
    files: dict[str, bytes] = {}
    children = []
    for i in range(0, len(urls), URLS_PER_SITEMAP):
        name = f"/sitemaps/{i // URLS_PER_SITEMAP}.xml.gz"
        entries = "".join(f"<url><loc>{u}</loc></url>" for u in urls[i : i + URLS_PER_SITEMAP])
        xml = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
        files[name] = gzip.compress(xml.encode(), compresslevel=5)
        children.append(f"<sitemap><loc>{spec.origin(0)}{name}</loc></sitemap>")
    index = (
        '<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        + "".join(children)
        + "</sitemapindex>"
    )
    files["/sitemap_index.xml"] = index.encode()
    return files


class Site:
    def __init__(self, spec: SiteSpec, with_sitemaps: bool = True, prebuild: bool = False) -> None:
        self.spec = spec
        # Millions of pages (bench/deep_frontier.py) have their sitemaps written to disk elsewhere.
        self.sitemaps = sitemap_files(spec) if with_sitemaps else {}
        self.pages = {h: {} for h in range(spec.hosts)}  # type: dict[int, dict[int, bytes]]
        if prebuild:
            # Every page built before the first request: otherwise the first of two crawls of the
            # same site pays for building them, and the site's CPU a page differs between them.
            for host, built in self.pages.items():
                for n in range(spec.pages_per_host):
                    built[n] = page_html(spec.origin(host), n, spec.pages_per_host, spec.links_per_page)
        self.served = 0
        self.real_pages = set(spec.real_paths)
        self.real_cache: dict[str, bytes] = {}  # the same bytes on every host

    def answer(self, host: int, path: str) -> tuple[int, str, bytes]:
        if path == "/robots.txt":
            return (
                200,
                "text/plain",
                f"User-agent: *\nAllow: /\nSitemap: {self.spec.origin(0)}/sitemap_index.xml\n".encode(),
            )
        if host == 0 and path in self.sitemaps:
            kind = "application/gzip" if path.endswith(".gz") else "application/xml"
            return 200, kind, self.sitemaps[path]
        if path in self.real_pages and self.spec.root:
            body = self.real_cache.get(path)
            if body is None:
                body = self.real_cache[path] = (self.spec.root / path.lstrip("/")).read_bytes()
            return 200, "text/html; charset=utf-8", body
        if path.startswith("/p/") and path.endswith(".html"):
            try:
                n = int(path[3:-5])
            except ValueError:
                n = -1
            if 0 <= n < self.spec.pages_per_host:
                cached = self.pages[host].get(n)
                if cached is None:
                    cached = self.pages[host][n] = page_html(
                        self.spec.origin(host), n, self.spec.pages_per_host, self.spec.links_per_page
                    )
                return 200, "text/html; charset=utf-8", cached
        return 404, "text/plain", b"not found"

    async def serve_connection(
        self, host: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, header_block = head.decode("latin-1").partition("\r\n")
                parts = request_line.split(" ")
                path = parts[1] if len(parts) == 3 else "/"
                close = "connection: close" in header_block.lower()
                status, kind, body = self.answer(host, path.split("?")[0])
                if self.spec.delay_ms and kind.startswith("text/html"):
                    await asyncio.sleep(self.spec.delay_ms / 1000)
                reason = "OK" if status == 200 else "Not Found"
                writer.write(
                    f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                    f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                self.served += 1
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def serve(spec: SiteSpec, with_sitemaps: bool = True, prebuild: bool = False) -> None:
    site = Site(spec, with_sitemaps, prebuild)
    servers = []
    for h in range(spec.hosts):

        def handler(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, h: int = h
        ) -> asyncio.Future[None]:
            return asyncio.ensure_future(site.serve_connection(h, reader, writer))

        servers.append(
            await asyncio.start_server(handler, spec.host(h), spec.port, backlog=1024, reuse_address=True)
        )
    print(f"perf site: {spec.hosts} hosts at {spec.origin(0)} .. {spec.origin(spec.hosts - 1)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    for server in servers:
        server.close()
    print(f"perf site: served {site.served} responses", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf_site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages-per-host", type=int, default=250)
    parser.add_argument("--port", type=int, default=8531)
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--root", type=Path, help="serve the HTML pages of this directory")
    parser.add_argument(
        "--links-per-page", type=int, default=20, help="links of a generated page (default 20)"
    )
    parser.add_argument("--no-sitemaps", action="store_true", help="serve pages and robots.txt only")
    parser.add_argument(
        "--prebuild", action="store_true", help="build every generated page before serving any"
    )
    parser.add_argument("--write-urls", metavar="FILE", help="write every page URL to FILE and exit")
    args = parser.parse_args(argv)
    if args.root:
        spec = SiteSpec.of_directory(args.root, args.hosts, args.pages_per_host, args.port, args.delay_ms)
    else:
        spec = SiteSpec(
            args.hosts, args.pages_per_host, args.port, args.delay_ms, links_per_page=args.links_per_page
        )
    if args.write_urls:
        with open(args.write_urls, "w") as out:
            out.write("\n".join(spec.page_urls()) + "\n")
        return 0
    asyncio.run(serve(spec, with_sitemaps=not args.no_sitemaps, prebuild=args.prebuild))
    return 0


if __name__ == "__main__":
    sys.exit(main())
