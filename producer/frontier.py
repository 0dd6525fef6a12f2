"""The frontier: what a discovery run does with the links of the pages a worker stored.

    PageLinks (one or many pages a message) → canonicalise, session ids dropped (invalid:
    counted) → past the depth, out of scope: counted → seen already (one read): `duplicate` →
    over a budget: `budget` → the producer's own pipeline (claim, route, publish confirmed,
    mark seen, count `enqueued`)

Links cut here never entered the run: the run's stats hash counts them by reason, under
`discovered.<reason>` (DISCOVERY_REASONS), as the producer counts its duplicates. What goes on
goes through producer/pipeline.py with the same claims and marks as the producer's: a
frontier killed while publishing leaves claims that the next frontier takes over once this
one's heartbeat has lapsed, and links it had confirmed are duplicates then. Its handler
returns only once the pipeline has settled everything, so the page's message is acked only once
its links are on their way; a crash before that gives the message to the next frontier whole.

A link whose fate cannot change for the rest of the run (seen already, out of scope, invalid) is
remembered as it came, in SettledLinks: a site links most of its pages from many others (50
links a page on the bench's site, each page linked from about 50), and the second and later
times a link comes it costs one dict lookup, not canonicalising, a fingerprint and a Redis read.

Budgets: `max_pages` bounds the run's enqueued URLs (sitemap and start URLs included), read
from the stats hash before each page; `max_pages_per_host` the URLs enqueued per host, kept in
Keys.run_discovered_hosts. A host's count is added once its links are confirmed, so a frontier
killed between the two leaves it short by those links: the bound is then passed by at most one
page's links.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit, urlunsplit

from producer.discovery_scope import UNLIMITED, DiscoveryOptions, Scope
from producer.pipeline_types import Counts
from producer.sitemaps import SitemapEntry
from shared.links_message import PageLinks
from shared.urls import InvalidURL, canonicalize, domain_of, fingerprint

log = logging.getLogger(__name__)

DISCOVERY_REASONS = ("out_of_scope", "depth", "budget", "duplicate", "invalid", "cancelled")


LINKS_SEEN = "discovered.links_seen"


# Query arguments and path parameters that name a visitor's session, not a page: a site that
# puts them in its links would otherwise offer every page again under each new session.
SESSION_ID_NAMES = frozenset({"jsessionid", "phpsessid", "sid", "sessionid", "session_id", "aspsessionid"})


def without_session_ids(canonical: str) -> str:
    """`canonical` less its session-id arguments (`;jsessionid=...` and `?...&PHPSESSID=...`); a
    URL that has none comes back as it is, at the cost of two `in` tests."""
    if "?" not in canonical and ";" not in canonical:
        return canonical
    parts = urlsplit(canonical)
    path = ";".join(
        segment
        for i, segment in enumerate(parts.path.split(";"))
        if i == 0 or segment.partition("=")[0].lower() not in SESSION_ID_NAMES
    )
    query = "&".join(
        argument
        for argument in parts.query.split("&")
        if argument.partition("=")[0].lower() not in SESSION_ID_NAMES
    )
    return urlunsplit(parts._replace(path=path, query=query))


def reason_counter(reason: str) -> str:
    """The stats-hash field counting links cut for `reason`."""
    return f"discovered.{reason}"


class FrontierState(Protocol):
    """What the frontier reads and adds to in Redis (producer/frontier_redis.py)."""

    def options(self, run_id: str) -> DiscoveryOptions | None: ...
    def cancelled(self, run_id: str) -> bool: ...
    def seen(self, run_id: str, fingerprints: Sequence[bytes]) -> list[bool]: ...
    def enqueued_total(self, run_id: str) -> int: ...
    def host_counts(self, run_id: str, hosts: Sequence[str]) -> dict[str, int]: ...
    def add(self, run_id: str, cut: dict[str, int], hosts: dict[str, int]) -> None: ...
    def forget(self, run_id: str) -> None: ...  # read the run's options and state afresh


# Links remembered (SettledLinks), in two generations of half this each: about 200 bytes a link,
# so at most ~40 MB, and a run's last 100,000 distinct links always among them.
SETTLED_LINKS_KEPT = 200_000
# A run id can be used again once its run has ended and been deleted (`ops.crawl --fresh`): its
# links are new then. What the frontier remembers of a run (its options, scope and settled
# links) counts only while the run's pages keep coming, at most this far apart: a run's end, its
# delete and a new seeding leave a longer gap than this before the next page's links arrive, and
# a crawl sends them closer together (a polite one, a page a second, just rebuilds it more often).
FORGET_RUN_AFTER_S = 2.0


class SettledLinks:
    """Links whose reason to be cut is settled for the rest of their run, as they came in a page
    (before canonicalising): `duplicate` for a URL seen (confirmed or handled: a mark is never
    taken back within a run), `out_of_scope` and `invalid` (a run's scope does not change).
    Not a link merely claimed, nor one over a budget: those may yet go either way.

    Bounded by two generations: a link is looked up in the recent one, then in the older (and
    moved to the recent one when found there); when the recent one is full, it becomes the older
    and the older is dropped. A link dropped costs its canonicalising and Redis read again."""

    def __init__(self, kept: int = SETTLED_LINKS_KEPT) -> None:
        self._generation = max(kept // 2, 1)
        self._recent: dict[tuple[str, str], str] = {}
        self._older: dict[tuple[str, str], str] = {}

    def reason(self, run_id: str, link: str) -> str | None:
        key = (run_id, link)
        reason = self._recent.get(key)
        if reason is None:
            reason = self._older.get(key)
            if reason is not None:
                self._remember(key, reason)
        return reason

    def settle(self, run_id: str, link: str, reason: str) -> None:
        self._remember((run_id, link), reason)

    def __len__(self) -> int:
        return len(self._recent) + len(self._older)

    def _remember(self, key: tuple[str, str], reason: str) -> None:
        self._recent[key] = reason
        if len(self._recent) >= self._generation:
            self._older, self._recent = self._recent, {}


class Found(NamedTuple):
    """Where a candidate link was first found in a message: as it came, on which page, and the
    depth it has there (the page's + 1; a message may hold pages of several depths)."""

    link: str
    page: str
    depth: int


# Publishes `entries` at `depth` for `run_id` through the producer's pipeline and returns its
# counts once everything is settled.
Enqueue = Callable[[str, int, list[SitemapEntry]], Counts]


@dataclass
class LinksOutcome:
    """What became of the links of one message's pages."""

    enqueued: int = 0
    cut: collections.Counter[str] = field(default_factory=collections.Counter)


class Frontier:
    def __init__(
        self,
        state: FrontierState,
        enqueue: Enqueue,
        settled: SettledLinks | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._enqueue = enqueue
        self._scopes: dict[str, Scope] = {}
        self._settled = SettledLinks() if settled is None else settled
        self._clock = clock
        # Per run: the name its settled links are kept under, and when its last page came.
        self._lives: dict[str, tuple[str, float]] = {}

    def take(self, pages: Sequence[PageLinks]) -> LinksOutcome:
        """Follow the links of `pages` (those of one message): each run's together, with one
        seen read and one counters call for all its pages, and one publish a depth (a host,
        under a per-host budget) of what is new."""
        outcome = LinksOutcome()
        by_run: dict[str, list[PageLinks]] = {}
        for page in pages:
            by_run.setdefault(page.run_id, []).append(page)
        for run_id, run_pages in by_run.items():
            self._take_run(run_id, run_pages, outcome)
        return outcome

    def _take_run(self, run_id: str, pages: list[PageLinks], outcome: LinksOutcome) -> None:
        life = self._keep_or_forget(run_id)
        cut: collections.Counter[str] = collections.Counter()
        links_seen = sum(len(page.links) for page in pages)
        options = self._state.options(run_id)
        if options is None:  # a run that does not discover, or no longer known: nothing to follow
            cut["out_of_scope"] += links_seen
        elif self._state.cancelled(run_id):  # (a paused run's are held by the workers)
            cut["cancelled"] += links_seen
        else:
            within = [page for page in pages if page.depth <= options.max_depth]
            cut["depth"] += sum(len(page.links) for page in pages if page.depth > options.max_depth)
            if within:
                outcome.enqueued += self._follow(run_id, within, life, options, cut)
        outcome.cut.update(cut)
        counters = {reason_counter(r): n for r, n in cut.items() if n}
        counters[LINKS_SEEN] = links_seen  # what the frontier's rate is measured in (bench/discovery.py)
        self._state.add(run_id, counters, {})

    def _keep_or_forget(self, run_id: str) -> str:
        """A page of `run_id` now: after a gap of FORGET_RUN_AFTER_S, what was remembered of the
        run goes (its settled links are left under their old name, to age out). Returns the
        name the run's settled links are kept under now."""
        now = self._clock()
        life = self._lives.get(run_id)
        if life is None or now - life[1] > FORGET_RUN_AFTER_S:
            if life is not None:
                self._scopes.pop(run_id, None)
                self._state.forget(run_id)
            life = (f"{run_id} {now!r}", now)  # a space: never in a run id (RUN_ID_PATTERN)
        self._lives[run_id] = (life[0], now)
        return life[0]

    def _follow(
        self,
        run_id: str,
        pages: list[PageLinks],
        life: str,
        options: DiscoveryOptions,
        cut: collections.Counter[str],
    ) -> int:
        """Publish what is new of the links of `pages`, all of run `run_id` and within its depth;
        returns how many were enqueued."""
        candidates = self._in_scope(pages, life, self._scope(run_id, options), cut)
        urls = list(candidates)
        # One read first: a page linking to itself or to pages already seen costs this lookup,
        # no claim and no publish, and what is seen does not use up a budget.
        seen = self._state.seen(run_id, [fingerprint(url) for url in urls]) if urls else []
        fresh = []
        for url, was_seen in zip(urls, seen, strict=True):
            if was_seen:
                self._settled.settle(life, candidates[url].link, "duplicate")
            else:
                fresh.append(url)
        cut["duplicate"] += len(urls) - len(fresh)
        enqueued = 0
        per_host = options.max_pages_per_host != UNLIMITED
        for host, host_urls in self._within_budgets(run_id, options, fresh, cut).items():
            by_depth: dict[int, list[SitemapEntry]] = {}
            for url in host_urls:
                found = candidates[url]
                by_depth.setdefault(found.depth, []).append(SitemapEntry(url=url, source=found.page))
            # What the pipeline found claimed or confirmed meanwhile (by a frontier killed before
            # its ack) it counts as the producer's `duplicates`.
            host_enqueued = sum(
                self._enqueue(run_id, depth, entries).enqueued_total for depth, entries in by_depth.items()
            )
            enqueued += host_enqueued
            if per_host and host_enqueued:
                self._state.add(run_id, {}, {host: host_enqueued})
        return enqueued

    def _in_scope(
        self, pages: list[PageLinks], life: str, scope: Scope, cut: collections.Counter[str]
    ) -> dict[str, Found]:
        """The pages' links in canonical form, in scope, each once, in first-seen order, each
        with where it was found; links already settled are counted, and others settled here."""
        candidates: dict[str, Found] = {}  # a page repeats its links, and pages each other's
        settled = self._settled
        for page in pages:
            for link in page.links:
                reason = settled.reason(life, link)
                if reason is not None:
                    cut[reason] += 1
                    continue
                try:
                    canonical = without_session_ids(canonicalize(link))
                except InvalidURL:
                    cut["invalid"] += 1
                    settled.settle(life, link, "invalid")
                    continue
                if not scope.admits(canonical):
                    cut["out_of_scope"] += 1
                    settled.settle(life, link, "out_of_scope")
                elif canonical in candidates:
                    cut["duplicate"] += 1
                    if page.depth < candidates[canonical].depth:  # the shortest way to it counts
                        candidates[canonical] = Found(link, page.page, page.depth)
                else:
                    candidates[canonical] = Found(link, page.page, page.depth)
        return candidates

    def _within_budgets(
        self, run_id: str, options: DiscoveryOptions, fresh: list[str], cut: collections.Counter[str]
    ) -> dict[str, list[str]]:
        """The links that fit the run's and their hosts' budgets, by host."""
        if options.max_pages:
            room = max(options.max_pages - self._state.enqueued_total(run_id), 0)
            cut["budget"] += max(len(fresh) - room, 0)
            fresh = fresh[:room]
        by_host: dict[str, list[str]] = collections.defaultdict(list)
        for url in fresh:
            by_host[domain_of(url)].append(url)
        if options.max_pages_per_host != UNLIMITED and by_host:
            counts = self._state.host_counts(run_id, list(by_host))
            for host, host_urls in by_host.items():
                host_room = max(options.max_pages_per_host - counts.get(host, 0), 0)
                cut["budget"] += max(len(host_urls) - host_room, 0)
                del host_urls[host_room:]
        return {host: urls for host, urls in by_host.items() if urls}

    def _scope(self, run_id: str, options: DiscoveryOptions) -> Scope:
        scope = self._scopes.get(run_id)
        if scope is None:
            scope = self._scopes[run_id] = Scope(options)
        return scope
