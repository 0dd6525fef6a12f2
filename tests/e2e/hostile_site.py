"""A site of hostile pages on 127.0.0.1, each path one attack, beside ordinary pages.

    /robots.txt                 allows everything
    /normal/<n>.html            a small ordinary page
    /drip-headers.html          the status line, then headers one byte per DRIP_S, for minutes
    /drip-body.html             headers, then a body of 100,000 bytes one byte per DRIP_S
    /deep.html                  200,000 nested <div> (2.2 MB)
    /deep-few-tags.html         600 nested <div>: too few '<' to be refused before parsing
    /wide.html                  150,000 <p> (0.6 MB): few enough '<' to be parsed, then stopped
                                at the node budget: the most memory a tree may take
    /links.html                 1,000,000 links (17.9 MB; needs MAX_BODY_BYTES raised)
    /links-fewer.html           399,000 links (7.1 MB)
    /many-attributes.html       one tag with 200,000 attributes (1.9 MB)
    /huge-attribute.html        one attribute value of 4 MB (a tag longer than the 1 MiB allowed)
    /big-attribute.html         one attribute value of 512 KB, as a large inline image would be
    /gzip-bomb.html             Content-Encoding: gzip, 100 MB of zeros in 97 KB
    /redirect/<n>.html          a redirect to /redirect/<n+1>.html, endlessly
    /bad-utf8.html              labelled UTF-8, full of bytes that are not
    /utf7-trap.html             labelled UTF-7, decoding to a lone surrogate
    /charset-lie.html           labelled with base64, a codec that is no text encoding
    /generated/<n>.html         the n-th of the generated pages given to the site

Every request is counted by path. Dripping answers stop when the client hangs up.
"""

from __future__ import annotations

import collections
import gzip
import threading

from tests.local_site import LocalServer, LocalSite, QuietHandler

DRIP_S = 0.2
HTML = "text/html; charset=utf-8"
NORMAL = (
    "<!DOCTYPE html><html lang='en'><head><title>{path}</title></head>"
    "<body><h1>{path}</h1><p>{filler}</p><a href='/normal/1.html'>home</a></body></html>"
)


def _deep(depth: int) -> bytes:
    return b"<html><body>" + b"<div>" * depth + b"x" + b"</div>" * depth + b"</body></html>"


def _links(count: int) -> bytes:
    return b"<html><body>" + b"".join(b"<a href=/l/%d>" % i for i in range(count)) + b"</body></html>"


def _fixed_pages() -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """path -> (Content-Type, body, extra headers)."""
    many = b" ".join(b"a%d=x" % i for i in range(200_000))
    return {
        "/deep.html": (HTML, _deep(200_000), {}),
        "/deep-few-tags.html": (HTML, _deep(600), {}),
        "/wide.html": (HTML, b"<html><body>" + b"<p>x" * 150_000 + b"</body></html>", {}),
        "/links.html": (HTML, _links(1_000_000), {}),
        "/links-fewer.html": (HTML, _links(399_000), {}),
        "/many-attributes.html": (HTML, b"<html><body><p " + many + b">x</p></body></html>", {}),
        "/huge-attribute.html": (
            HTML,
            b"<html><head><title>big</title></head><body><div title='"
            + b"a" * 4_000_000
            + b"'>x</div></body></html>",
            {},
        ),
        "/big-attribute.html": (
            HTML,
            b"<html><head><title>big</title></head><body><img src='data:,"
            + b"a" * 512_000
            + b"'><p>x</p></body></html>",
            {},
        ),
        "/gzip-bomb.html": (HTML, gzip.compress(b"\0" * 100_000_000, 9), {"Content-Encoding": "gzip"}),
        "/bad-utf8.html": (
            HTML,
            b"<html><title>\xff\xfe\xc3</title><body>" + bytes(range(128, 256)) * 50,
            {},
        ),
        # '+2AA-' is UTF-7 for U+D800, a surrogate that no UTF encoder accepts.
        "/utf7-trap.html": (
            "text/html; charset=utf-7",
            b"<html><title>+2AA-</title><body>+2AA-</body></html>",
            {},
        ),
        "/charset-lie.html": ("text/html; charset=base64", b"<html><title>lie</title></html>", {}),
    }


class _Handler(QuietHandler):
    server: LocalServer[HostileSite]

    def do_GET(self) -> None:
        site = self.server.site
        path = self.path.split("?")[0]
        with site.lock:
            site.hits[path] += 1
        if path == "/robots.txt":
            return self.send(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path.startswith("/normal/"):
            return self.send(200, HTML, NORMAL.format(path=path, filler="lorem ipsum " * 20).encode())
        if path.startswith("/redirect/"):
            n = int(path.split("/")[2].split(".")[0])
            return self.send(302, HTML, b"", {"Location": f"/redirect/{n + 1}.html"})
        if path.startswith("/generated/"):
            n = int(path.split("/")[2].split(".")[0])
            content_type, body = site.generated[n]
            return self.send(200, content_type, body)
        if path == "/drip-headers.html":
            return self._drip(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Drip: " + b"a" * 5_000)
        if path == "/drip-body.html":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100000\r\n\r\n"
            self.wfile.write(head)
            return self._drip(b"<html>" + b"a" * 99_994)
        if path in site.pages:
            content_type, body, headers = site.pages[path]
            return self.send(200, content_type, body, headers)
        return self.send(404, "text/plain", b"not found\n")

    def _drip(self, data: bytes) -> None:
        self.close_connection = True
        try:
            for i in range(len(data)):
                if self.server.site.stopping.wait(DRIP_S):
                    return
                self.wfile.write(data[i : i + 1])
        except OSError:
            return


class HostileSite(LocalSite):
    handler = _Handler

    def __init__(self, generated: list[tuple[str, bytes]] | None = None) -> None:
        super().__init__()
        self.generated = generated or []  # (Content-Type, body) served at /generated/<n>.html
        self.pages = _fixed_pages()
        self.hits: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()  # a dripping answer ends now instead of minutes later
        super().stop()
