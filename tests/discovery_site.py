"""A site whose link graph a test knows, for discovery crawls: pages, nofollow links, a page
whose meta robots and one whose X-Robots-Tag say nofollow, robots.txt, a redirect, a 404, links
to another host, several spellings of one URL and an endless calendar.

`expected(root, depth)` is the test's own breadth-first answer: which URLs a discovery crawl from
`/` to that depth stores, dead-letters and skips. Paths are relative to the site's root, so the
graph is written once and served on any port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tests.local_site import LocalSite, QuietHandler

CALENDAR = re.compile(r"/cal/([0-9]{1,6})")


@dataclass(frozen=True)
class Node:
    links: tuple[str, ...] = ()  # hrefs as the page writes them (each resolved against /)
    followed: tuple[str, ...] = ()  # the paths those links reach that a crawl follows
    nofollow: tuple[str, ...] = ()  # hrefs written with rel="nofollow"
    meta_nofollow: bool = False
    header_nofollow: bool = False
    redirect_to: str | None = None


@dataclass
class Graph:
    nodes: dict[str, Node] = field(default_factory=dict)
    disallowed: tuple[str, ...] = ("/private/",)
    missing: tuple[str, ...] = ("/gone",)


def build_graph(other_root: str) -> Graph:
    """The site: / links to a, b, the calendar, a redirect, a 404, a robots-disallowed page,
    another host and several spellings of /a."""
    graph = Graph()
    nodes = graph.nodes
    nodes["/"] = Node(
        links=(
            "/",
            "/a",
            "b",
            "/a#top",
            "/./a",
            "/x/../a",
            "/q?b=2&a=1",
            "/q?a=1&b=2",
            "/cal/0",
            "/old",
            "/gone",
            "/private/p",
            other_root + "/",
        ),
        followed=("/", "/a", "/b", "/q?a=1&b=2", "/cal/0", "/old", "/gone", "/private/p"),
        nofollow=("/secret",),
    )
    nodes["/a"] = Node(
        links=("/", "/a", "/c", "/meta", "/header"), followed=("/", "/a", "/c", "/meta", "/header")
    )
    nodes["/b"] = Node(links=("/c", "/d"), followed=("/c", "/d"))
    nodes["/c"] = Node(links=("/e", "/a"), followed=("/e", "/a"))
    nodes["/d"] = Node(links=("/e", "/f"), followed=("/e", "/f"))
    nodes["/e"] = Node(links=("/f",), followed=("/f",))
    nodes["/f"] = Node(links=("/g",), followed=("/g",))
    nodes["/g"] = Node()
    nodes["/q?a=1&b=2"] = Node(links=("/q?a=1&b=2", "/g"), followed=("/q?a=1&b=2", "/g"))
    nodes["/new"] = Node(links=("/n1",), followed=("/n1",))
    nodes["/n1"] = Node()
    nodes["/old"] = Node(redirect_to="/new")
    nodes["/secret"] = Node()  # reached only by a nofollow link
    nodes["/meta"] = Node(links=("/meta-child",), meta_nofollow=True)
    nodes["/header"] = Node(links=("/header-child",), header_nofollow=True)
    nodes["/meta-child"] = Node()
    nodes["/header-child"] = Node()
    nodes["/private/p"] = Node()
    return graph


def calendar_node(month: int) -> Node:
    """An endless calendar: each month links the next."""
    return Node(links=(f"/cal/{month + 1}",), followed=(f"/cal/{month + 1}",))


def node_of(graph: Graph, path: str) -> Node | None:
    found = CALENDAR.fullmatch(path)
    if found:
        return calendar_node(int(found.group(1)))
    return graph.nodes.get(path)


@dataclass(frozen=True)
class Expected:
    stored: frozenset[str]
    dead: frozenset[str]
    skipped: frozenset[str]


def expected(graph: Graph, root: str, depth: int) -> Expected:
    """Breadth first from / to `depth`: what is stored, dead-lettered (404) and skipped (robots)."""
    stored: set[str] = set()
    dead: set[str] = set()
    skipped: set[str] = set()
    seen = {"/"}
    level = ["/"]
    for d in range(depth + 1):
        following: list[str] = []
        for path in level:
            if path in graph.missing:
                dead.add(path)
                continue
            if path.startswith(graph.disallowed):
                skipped.add(path)
                continue
            stored.add(path)
            node = node_of(graph, path)
            assert node is not None, path
            if node.redirect_to is not None:  # its links are the target's
                node = node_of(graph, node.redirect_to)
                assert node is not None
            if d == depth or node.meta_nofollow or node.header_nofollow:
                continue
            for link in node.followed:
                if link not in seen:
                    seen.add(link)
                    following.append(link)
        level = following
    return Expected(
        frozenset(root + p for p in stored),
        frozenset(root + p for p in dead),
        frozenset(root + p for p in skipped),
    )


class DiscoveryHandler(QuietHandler):
    def do_GET(self) -> None:
        site: DiscoverySite = self.server.site
        path, _, query = self.path.partition("?")
        if query:  # one spelling of a query: its arguments sorted, as the crawler spells it
            path += "?" + "&".join(sorted(query.split("&")))
        site.requested.append(path)
        graph = site.graph
        if path == "/robots.txt":
            rules = "".join(f"Disallow: {p}\n" for p in graph.disallowed)
            self.send(200, "text/plain", f"User-agent: *\n{rules}".encode())
            return
        node = node_of(graph, path)
        if node is None or path in graph.missing:
            self.send(404, "text/html", b"<html><body>not here</body></html>")
            return
        if node.redirect_to is not None:
            self.send(301, "text/html", b"", {"Location": node.redirect_to})
            return
        meta = '<meta name="robots" content="noindex, nofollow">' if node.meta_nofollow else ""
        anchors = "".join(f'<a href="{href}">{href}</a> ' for href in node.links)
        anchors += "".join(f'<a rel="nofollow" href="{href}">{href}</a> ' for href in node.nofollow)
        body = f"<html><head><title>{path}</title>{meta}</head><body><h1>{path}</h1>{anchors}</body></html>"
        headers = {"X-Robots-Tag": "nofollow"} if node.header_nofollow else {}
        self.send(200, "text/html; charset=utf-8", body.encode(), headers)


class DiscoverySite(LocalSite):
    handler = DiscoveryHandler

    def __init__(self, other_root: str) -> None:
        super().__init__()
        self.graph = build_graph(other_root)
        self.requested: list[str] = []


class OtherHandler(QuietHandler):
    def do_GET(self) -> None:
        self.server.site.requested.append(self.path)
        self.send(200, "text/html", b"<html><body>another host</body></html>")


class OtherSite(LocalSite):
    """The host off scope: nothing of it may be fetched."""

    handler = OtherHandler

    def __init__(self) -> None:
        super().__init__()
        self.requested: list[str] = []
