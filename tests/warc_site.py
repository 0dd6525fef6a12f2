"""A site for the WARC tests: pages sent plain, gzip-encoded and chunked, each with an ETag that a
conditional request is answered 304 for. `served` keeps what each page's body is, decoded, so a
test can hold the records and a replay to it."""

from __future__ import annotations

import gzip

from tests.local_site import LocalServer, LocalSite, QuietHandler

KINDS = ("plain", "gzip", "chunked")


def page_body(n: int) -> bytes:
    words = " ".join(f"word{n}-{i}" for i in range(400))
    head = f"<html><head><title>Page {n}</title></head>"
    return f"{head}<body><h1>Page {n}</h1><p>{words}</p></body></html>".encode()


class WarcSiteHandler(QuietHandler):
    server: LocalServer[WarcSite]

    def do_GET(self) -> None:
        site = self.server.site
        if self.path == "/sitemap.xml":
            self.send(200, "application/xml", site.sitemap())
            return
        if not self.path.startswith("/p/") or not self.path.endswith(".html"):
            self.send(404, "text/plain", b"no")
            return
        n = int(self.path[3:-5])
        etag = f'"v{n}"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return
        body = page_body(n)
        kind = KINDS[n % len(KINDS)]
        headers = {"ETag": etag, "Cache-Control": "max-age=0"}
        if kind == "gzip" and "gzip" in self.headers.get("Accept-Encoding", ""):
            self.send(
                200,
                "text/html; charset=utf-8",
                gzip.compress(body, mtime=0),
                {**headers, "Content-Encoding": "gzip"},
            )
        elif kind == "chunked":
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            for start in range(0, len(body), 1000):
                piece = body[start : start + 1000]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send(200, "text/html; charset=utf-8", body, headers)


class WarcSite(LocalSite):
    handler = WarcSiteHandler

    def __init__(self, pages: int = 9) -> None:
        super().__init__()
        self.pages = pages

    def page_url(self, n: int) -> str:
        return self.url(f"/p/{n}.html")

    def served(self) -> dict[str, bytes]:
        return {self.page_url(n): page_body(n) for n in range(1, self.pages + 1)}

    def sitemap(self) -> bytes:
        entries = "".join(f"<url><loc>{self.page_url(n)}</loc></url>" for n in range(1, self.pages + 1))
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
        ).encode()
