"""Discovery: the options and their checks, the scope, the frontier's cuts and budgets, the
links a page lets a run follow, and the message a worker sends for them."""

from __future__ import annotations

import collections
from collections.abc import Sequence

import pytest

from producer.discovery_args import DiscoveryArgs
from producer.discovery_scope import DiscoveryOptions, Scope
from producer.frontier import FORGET_RUN_AFTER_S, LINKS_SEEN, Frontier, SettledLinks, reason_counter
from producer.pipeline_types import Counts
from producer.serve import options_for
from producer.sitemaps import SitemapEntry
from shared.amqp.topology import build_topology, discovery_exchange
from shared.crawl_request import CrawlRequest, InvalidRequest, check
from shared.errors import BlockedAddress, ConfigError, DecodeError
from shared.links_message import MAX_PAGES_A_MESSAGE, PageLinks, decode_pages, join_pages
from shared.messages import CrawlTask
from shared.settings import Settings
from shared.urls import fingerprint
from worker.fetch.response import Response
from worker.handling.discovered_links import after_storing
from worker.parse.page import parse_page

SITE = "http://site.test"


def options(**given: object) -> DiscoveryOptions:
    made = DiscoveryOptions.checked(
        start_urls=given.pop("start_urls", [f"{SITE}/"]),  # type: ignore[arg-type]
        max_depth=given.pop("max_depth", 2),  # type: ignore[arg-type]
        **given,  # type: ignore[arg-type]
    )
    assert made is not None
    return made


def refuse_loopback(url: str) -> None:
    if "127.0.0.1" in url:
        raise BlockedAddress("127.0.0.1 is a loopback address")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"start_urls": ["http://exa mple.com/"]}, "--start 'http://exa mple.com/'"),
        ({"start_urls": ["ftp://example.com/"]}, "not http/https"),
        ({"start_urls": ["http://127.0.0.1:8000/"], "check_address": refuse_loopback}, "loopback"),
        ({"max_depth": -1}, "--max-depth -1"),
        ({"include": ["("]}, "--include '('"),
        ({"exclude": ["[a-"]}, "--exclude '[a-'"),
        ({"max_pages": -5}, "--max-pages -5"),
        ({"scope": "planet"}, "--scope 'planet'"),
    ],
)
def test_bad_input_is_one_line_naming_it(given: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        options(**given)
    assert named in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_run_without_start_urls_or_depth_discovers_nothing() -> None:
    assert DiscoveryOptions.checked([], None) is None
    assert options(start_urls=[], max_depth=1, other_roots=[f"{SITE}/sitemap.xml"]).roots == (
        f"{SITE}/sitemap.xml",
    )


def test_options_survive_their_encoding() -> None:
    made = options(include=["a"], exclude=["b"], max_pages_per_host=3, scope="prefix")
    assert DiscoveryOptions.decode(made.encode()) == made


@pytest.mark.parametrize(
    ("scope", "url", "admitted"),
    [
        ("host", "http://www.site.test/a", True),
        ("host", "http://www.site.test:8080/a", False),
        ("host", "http://blog.site.test/a", False),
        ("domain", "http://blog.site.test/a", True),
        ("domain", "http://site.test/a", True),
        ("domain", "http://notsite.test/a", False),
        ("prefix", "http://www.site.test/docs/a/b", True),
        ("prefix", "http://www.site.test/blog/", False),
    ],
)
def test_scopes(scope: str, url: str, admitted: bool) -> None:
    made = options(start_urls=["http://www.site.test/docs/index.html"], scope=scope)
    assert Scope(made).admits(url) is admitted


def test_include_and_exclude_patterns() -> None:
    scope = Scope(options(include=[r"/docs/"], exclude=[r"\.pdf$"]))
    assert scope.admits(f"{SITE}/docs/a")
    assert not scope.admits(f"{SITE}/docs/a.pdf")
    assert not scope.admits(f"{SITE}/blog/a")


class FakeState:
    def __init__(self, made: DiscoveryOptions, seen: Sequence[str] = (), enqueued: int = 0) -> None:
        self.made = made
        self.seen_fps = {fingerprint(url) for url in seen}
        self.enqueued = enqueued
        self.cut: collections.Counter[str] = collections.Counter()
        self.hosts: collections.Counter[str] = collections.Counter()
        self.lookups = 0
        self.reads = 0
        self.is_cancelled = False
        self.links_seen = 0
        self.forgotten: list[str] = []

    def options(self, run_id: str) -> DiscoveryOptions | None:
        return self.made

    def cancelled(self, run_id: str) -> bool:
        return self.is_cancelled

    def seen(self, run_id: str, fingerprints: Sequence[bytes]) -> list[bool]:
        self.lookups += len(fingerprints)
        self.reads += 1
        return [fp in self.seen_fps for fp in fingerprints]

    def enqueued_total(self, run_id: str) -> int:
        return self.enqueued

    def host_counts(self, run_id: str, hosts: Sequence[str]) -> dict[str, int]:
        return {host: self.hosts[host] for host in hosts if host in self.hosts}

    def forget(self, run_id: str) -> None:
        self.forgotten.append(run_id)

    def add(self, run_id: str, cut: dict[str, int], hosts: dict[str, int]) -> None:
        cut = dict(cut)
        self.links_seen += cut.pop(LINKS_SEEN, 0)
        self.cut.update(cut)
        self.hosts.update(hosts)


class FakeEnqueue:
    """The pipeline: every URL it is given is new, and seen from then on."""

    def __init__(self, state: FakeState) -> None:
        self.state = state
        self.published: list[tuple[int, str]] = []
        self.calls = 0

    def __call__(self, run_id: str, depth: int, entries: list[SitemapEntry]) -> Counts:
        counts = Counts()
        self.calls += 1
        for entry in entries:
            self.published.append((depth, entry.url))
            self.state.seen_fps.add(fingerprint(entry.url))
            self.state.enqueued += 1
            counts.enqueued["bulk"] += 1
        return counts


def frontier(state: FakeState) -> tuple[Frontier, FakeEnqueue]:
    enqueue = FakeEnqueue(state)
    return Frontier(state, enqueue), enqueue


def links(depth: int, *urls: str) -> PageLinks:
    return PageLinks("run-1", depth, f"{SITE}/", tuple(urls))


def test_links_are_cut_by_reason_and_the_rest_published_at_their_depth() -> None:
    state = FakeState(options(), seen=[f"{SITE}/"])
    front, enqueue = frontier(state)
    outcome = front.take(
        [
            links(
                1,
                f"{SITE}/",
                f"{SITE}/a",
                f"{SITE}/a#top",
                "http://SITE.test:80/a",
                "http://other.test/",
                f"{SITE}/b",
            )
        ]
    )
    assert enqueue.published == [(1, f"{SITE}/a"), (1, f"{SITE}/b")]
    assert outcome.enqueued == 2
    assert state.cut == {reason_counter("duplicate"): 3, reason_counter("out_of_scope"): 1}


@pytest.mark.parametrize(
    ("link", "canonical"),
    [
        (f"{SITE}/a;jsessionid=ABC123", f"{SITE}/a"),
        (f"{SITE}/a?PHPSESSID=x&page=2", f"{SITE}/a?page=2"),
        (f"{SITE}/a?sid=1", f"{SITE}/a"),
        (f"{SITE}/a?side=1", f"{SITE}/a?side=1"),
    ],
)
def test_session_ids_are_dropped_from_links(link: str, canonical: str) -> None:
    state = FakeState(options())
    front, enqueue = frontier(state)
    front.take([links(1, link)])
    assert enqueue.published == [(1, canonical)]


def test_links_past_the_depth_are_counted_not_followed() -> None:
    state = FakeState(options(max_depth=1))
    front, enqueue = frontier(state)
    front.take([links(2, f"{SITE}/deep1", f"{SITE}/deep2")])
    assert enqueue.published == []
    assert state.cut == {reason_counter("depth"): 2}
    assert state.lookups == 0


def test_a_cancelled_run_follows_nothing_more() -> None:
    state = FakeState(options())
    state.is_cancelled = True
    front, enqueue = frontier(state)
    front.take([links(1, f"{SITE}/a", f"{SITE}/b")])
    assert enqueue.published == []
    assert state.cut == {reason_counter("cancelled"): 2}


def test_a_page_of_links_already_seen_costs_lookups_not_publishes() -> None:
    seen = [f"{SITE}/p{i}" for i in range(1000)]
    state = FakeState(options(), seen=seen)
    front, enqueue = frontier(state)
    front.take([links(1, *seen)])
    assert enqueue.published == []
    assert state.lookups == 1000
    assert state.cut == {reason_counter("duplicate"): 1000}
    assert state.links_seen == 1000


def test_the_pages_of_one_message_are_followed_together() -> None:
    """One seen read for all of a message's pages, and one publish a depth; a link two pages
    share is one candidate, at the smaller of its depths; a page past the depth is cut whole."""
    state = FakeState(options(max_depth=3), seen=[f"{SITE}/old"])
    front, enqueue = frontier(state)
    outcome = front.take(
        [
            links(3, f"{SITE}/shared", f"{SITE}/old", f"{SITE}/x"),
            links(2, f"{SITE}/shared", f"{SITE}/y"),
            links(4, f"{SITE}/deep"),
        ]
    )
    assert enqueue.published == [(2, f"{SITE}/shared"), (2, f"{SITE}/y"), (3, f"{SITE}/x")]
    assert (state.reads, enqueue.calls, outcome.enqueued) == (1, 2, 3)
    assert state.cut == {reason_counter("duplicate"): 2, reason_counter("depth"): 1}
    assert state.links_seen == 6


def test_links_settled_once_cost_no_lookup_the_next_time() -> None:
    """Seen, out of scope or invalid: the next page with the same links counts them the same
    without canonicalising or reading Redis; a link only enqueued is read once more."""
    state = FakeState(options(), seen=[f"{SITE}/old1", f"{SITE}/old2"])
    front, enqueue = frontier(state)
    page = links(1, f"{SITE}/old1", f"{SITE}/old2", "http://other.test/", "http://[bad/", f"{SITE}/new")
    front.take([page])
    assert (state.lookups, enqueue.published) == (3, [(1, f"{SITE}/new")])
    front.take([page])  # /new is seen now: its read settles it
    assert state.lookups == 4
    front.take([page])
    assert state.lookups == 4 and enqueue.published == [(1, f"{SITE}/new")]
    assert state.cut == {
        reason_counter("duplicate"): 2 + 3 + 3,
        reason_counter("out_of_scope"): 3,
        reason_counter("invalid"): 3,
    }
    assert state.links_seen == 15


def test_a_run_whose_pages_stopped_coming_is_read_afresh() -> None:
    """A run id used again after its run was deleted: after a gap, what was settled of it, its
    options and its scope count no more; another run's pages do not keep it alive."""
    state = FakeState(options(), seen=[f"{SITE}/old"])
    now = [100.0]
    front = Frontier(state, FakeEnqueue(state), clock=lambda: now[0])
    front.take([links(1, f"{SITE}/old")])
    now[0] += FORGET_RUN_AFTER_S  # not past it: still the same run
    front.take([links(1, f"{SITE}/old")])
    assert state.lookups == 1 and state.forgotten == []
    now[0] += FORGET_RUN_AFTER_S + 0.1
    state.seen_fps.clear()  # the run deleted, its marks with it
    front.take([links(1, f"{SITE}/old")])
    assert state.lookups == 2 and state.enqueued == 1
    assert state.forgotten == ["run-1"]


def test_settled_links_are_bounded_and_keep_the_recent_ones() -> None:
    settled = SettledLinks(kept=4)
    for n in range(10):
        settled.settle("run-1", f"{SITE}/p{n}", "duplicate")
        assert settled.reason("run-1", f"{SITE}/p{n}") == "duplicate"
        assert len(settled) <= 4
    assert settled.reason("run-1", f"{SITE}/p9") == "duplicate"
    assert settled.reason("run-1", f"{SITE}/p0") is None  # dropped: read again when it comes
    assert settled.reason("run-2", f"{SITE}/p9") is None  # another run's links are its own


def test_budgets_bound_the_run_and_each_host() -> None:
    state = FakeState(options(max_pages=5, scope="domain"), enqueued=2)
    front, enqueue = frontier(state)
    front.take([links(1, *(f"{SITE}/p{i}" for i in range(10)))])
    assert [url for _, url in enqueue.published] == [f"{SITE}/p0", f"{SITE}/p1", f"{SITE}/p2"]
    assert state.cut == {reason_counter("budget"): 7}

    state = FakeState(options(max_pages=0, max_pages_per_host=2, scope="domain"))
    front, enqueue = frontier(state)
    front.take([links(1, f"{SITE}/a", f"{SITE}/b", f"{SITE}/c", "http://x.site.test/a")])
    front.take([links(1, f"{SITE}/d", "http://x.site.test/b", "http://x.site.test/c")])
    assert [url for _, url in enqueue.published] == [
        f"{SITE}/a",
        f"{SITE}/b",
        "http://x.site.test/a",
        "http://x.site.test/b",
    ]
    assert state.cut == {reason_counter("budget"): 3}


def test_a_calendar_trap_ends_at_the_depth() -> None:
    """Each calendar page links the next month: depth, not the trap, decides where it stops."""
    state = FakeState(options(max_depth=3), seen=[f"{SITE}/cal/0"])
    front, enqueue = frontier(state)
    queue = [(0, f"{SITE}/cal/0")]
    while queue:
        depth, url = queue.pop(0)
        month = int(url.rsplit("/", 1)[1])
        before = len(enqueue.published)
        front.take([links(depth + 1, f"{SITE}/cal/{month + 1}", url)])
        queue += enqueue.published[before:]
    assert [url for _, url in enqueue.published] == [f"{SITE}/cal/{m}" for m in (1, 2, 3)]
    assert state.cut[reason_counter("depth")] == 2


def test_links_message_round_trip_and_bounds() -> None:
    message = links(3, f"{SITE}/a")
    assert decode_pages(message.encode()) == [message]
    other = PageLinks("run-2", 1, f"{SITE}/b", (f"{SITE}/c", f"{SITE}/d"))
    assert decode_pages(join_pages([message.encode(), other.encode()])) == [message, other]
    too_many = join_pages([message.encode()] * (MAX_PAGES_A_MESSAGE + 1))
    for body in (
        b"[]",
        b"not json",
        b'{"run_id":"r","depth":0,"page":"x","links":[]}',
        b'{"pages":[]}',
        b'{"pages":[[]]}',
        too_many,
    ):
        with pytest.raises(DecodeError):
            decode_pages(body)


def test_a_task_carries_its_depth() -> None:
    task = CrawlTask(url=f"{SITE}/a", run_id="run-1", queue="bulk", depth=2)
    assert CrawlTask.decode(task.encode()).depth == 2
    assert CrawlTask.decode(CrawlTask(url=f"{SITE}/a", run_id="r", queue="bulk").encode()).depth is None


PAGE = """<html><head>{meta}<base href="http://site.test/docs/"></head><body>
<a href="a">a</a> <a href="b" rel="nofollow">b</a> <a rel="NoFollow noopener" href="c">c</a>
<a href="c">c again, followable</a> <map><area href="/area"></map> <a href="mailto:x@y">m</a>
</body></html>"""


@pytest.mark.parametrize("fast", [True, False])
def test_followed_links_leave_out_nofollow(fast: bool) -> None:
    page = parse_page(PAGE.format(meta=""), f"{SITE}/", fast=fast)
    assert page.links == (f"{SITE}/docs/a", f"{SITE}/docs/b", f"{SITE}/docs/c", f"{SITE}/area")
    assert page.follow == (f"{SITE}/docs/a", f"{SITE}/docs/c", f"{SITE}/area")


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("content", ["noindex, nofollow", "NONE", "nofollow"])
def test_a_meta_robots_nofollow_page_has_nothing_to_follow(fast: bool, content: str) -> None:
    page = parse_page(PAGE.format(meta=f'<meta name="robots" content="{content}">'), f"{SITE}/", fast=fast)
    assert page.follow == ()
    assert len(page.links) == 4


def test_a_stored_page_sends_its_links_only_in_a_discovery_run() -> None:
    topology = build_topology(Settings.from_env({}))
    page = parse_page(PAGE.format(meta=""), f"{SITE}/")
    response = Response(final_url=f"{SITE}/", status=200, content_type="text/html", body=b"")
    plain = CrawlTask(url=f"{SITE}/", run_id="run-1", queue="bulk")
    assert after_storing(topology, plain, page, response).publications == ()
    discovering = CrawlTask(url=f"{SITE}/", run_id="run-1", queue="bulk", depth=1)
    (publication,) = after_storing(topology, discovering, page, response).publications
    assert publication.exchange == discovery_exchange(topology.namespace)
    assert decode_pages(publication.body) == [PageLinks("run-1", 2, f"{SITE}/", page.follow)]
    told = Response(
        final_url=f"{SITE}/", status=200, content_type=None, body=b"", robots_tag="noarchive, nofollow"
    )
    assert after_storing(topology, discovering, page, told).publications == ()


def test_a_crawl_request_carries_the_discovery_fields_to_the_producer_options() -> None:
    body = {
        "run_id": "r1",
        "start_urls": [f"{SITE}/"],
        "max_depth": 2,
        "scope": "domain",
        "include": ["/docs/"],
        "exclude": [r"\.pdf$"],
        "max_pages": 50,
        "max_pages_per_host": 10,
    }
    request = CrawlRequest.decode(CrawlRequest.from_json(body, lambda: "unused").encode())
    check(request, lambda url: None)
    given = options_for(request).discovery
    assert given == DiscoveryArgs((f"{SITE}/",), 2, "domain", ("/docs/",), (r"\.pdf$",), 50, 10)
    assert CrawlRequest.from_json({"sitemaps": [f"{SITE}/s.xml"]}, lambda: "r2").max_depth is None


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("max_depth", -1, "max_depth: expected a whole number"),
        ("max_pages", "many", "max_pages: expected a whole number"),
        ("scope", "planet", "scope: expected one of host, domain, prefix"),
        ("include", ["("], "include '(': not a regular expression"),
    ],
)
def test_a_crawl_request_with_bad_discovery_fields_is_refused_in_one_line(
    field: str, value: object, named: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        CrawlRequest.from_json({"start_urls": [f"{SITE}/"], field: value}, lambda: "r3")
    assert named in str(caught.value)
