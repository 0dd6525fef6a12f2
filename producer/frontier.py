"""The frontier: what a discovery run does with the links of a page a worker stored.

    PageLinks (one message a page) → canonicalise, session ids dropped (invalid: counted) →
    past the depth, out of scope: counted → seen already (one read): `duplicate` → over a
    budget: `budget` → the producer's own pipeline (claim, route, publish confirmed, mark seen,
    count `enqueued`)

Links cut here never entered the run: the run's stats hash counts them by reason, under
`discovered.<reason>` (DISCOVERY_REASONS), as the producer counts its duplicates. What goes on
goes through producer/pipeline.py with the same claims and marks as the producer's: a
frontier killed while publishing leaves claims that the next frontier takes over once this
one's heartbeat has lapsed, and links it had confirmed are duplicates then. Its handler
returns only once the pipeline has settled everything, so the page's message is acked only once
its links are on their way; a crash before that gives the message to the next frontier whole.

Budgets: `max_pages` bounds the run's enqueued URLs (sitemap and start URLs included), read
from the stats hash before each page; `max_pages_per_host` the URLs enqueued per host, kept in
Keys.run_discovered_hosts. A host's count is added once its links are confirmed, so a frontier
killed between the two leaves it short by those links: the bound is then passed by at most one
page's links.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
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


# Publishes `entries` at `depth` for `run_id` through the producer's pipeline and returns its
# counts once everything is settled.
Enqueue = Callable[[str, int, list[SitemapEntry]], Counts]


@dataclass
class LinksOutcome:
    """What became of one page's links."""

    enqueued: int = 0
    cut: collections.Counter[str] = field(default_factory=collections.Counter)


class Frontier:
    def __init__(self, state: FrontierState, enqueue: Enqueue) -> None:
        self._state = state
        self._enqueue = enqueue
        self._scopes: dict[str, Scope] = {}

    def take(self, page: PageLinks) -> LinksOutcome:
        outcome = LinksOutcome()
        options = self._state.options(page.run_id)
        if options is None:  # a run that does not discover, or no longer known: nothing to follow
            outcome.cut["out_of_scope"] += len(page.links)
        elif self._state.cancelled(page.run_id):  # (a paused run's are held by the workers)
            outcome.cut["cancelled"] += len(page.links)
        elif page.depth > options.max_depth:
            outcome.cut["depth"] += len(page.links)
        else:
            self._follow(page, options, outcome)
        counters = {reason_counter(r): n for r, n in outcome.cut.items() if n}
        counters[LINKS_SEEN] = len(page.links)  # what the frontier's rate is measured in (bench/discovery.py)
        self._state.add(page.run_id, counters, {})
        return outcome

    def _follow(self, page: PageLinks, options: DiscoveryOptions, outcome: LinksOutcome) -> None:
        urls = self._in_scope(page, self._scope(page.run_id, options), outcome)
        # One read first: a page linking to itself or to pages already seen costs this lookup,
        # no claim and no publish, and what is seen does not use up a budget.
        seen = self._state.seen(page.run_id, [fingerprint(url) for url in urls]) if urls else []
        fresh = [url for url, was_seen in zip(urls, seen, strict=True) if not was_seen]
        outcome.cut["duplicate"] += len(urls) - len(fresh)
        for host, host_urls in self._within_budgets(page.run_id, options, fresh, outcome).items():
            entries = [SitemapEntry(url=url, source=page.page) for url in host_urls]
            enqueued = self._enqueue(page.run_id, page.depth, entries).enqueued_total
            # What the pipeline found claimed or confirmed meanwhile (by a frontier killed before
            # its ack) it counts as the producer's `duplicates`.
            outcome.enqueued += enqueued
            if options.max_pages_per_host != UNLIMITED and enqueued:
                self._state.add(page.run_id, {}, {host: enqueued})

    @staticmethod
    def _in_scope(page: PageLinks, scope: Scope, outcome: LinksOutcome) -> list[str]:
        """The page's links in canonical form, in scope, each once, in first-seen order."""
        candidates: dict[str, None] = {}  # a page repeats its links
        for link in page.links:
            try:
                canonical = without_session_ids(canonicalize(link))
            except InvalidURL:
                outcome.cut["invalid"] += 1
                continue
            if not scope.admits(canonical):
                outcome.cut["out_of_scope"] += 1
            elif canonical in candidates:
                outcome.cut["duplicate"] += 1
            else:
                candidates[canonical] = None
        return list(candidates)

    def _within_budgets(
        self, run_id: str, options: DiscoveryOptions, fresh: list[str], outcome: LinksOutcome
    ) -> dict[str, list[str]]:
        """The links that fit the run's and their hosts' budgets, by host."""
        if options.max_pages:
            room = max(options.max_pages - self._state.enqueued_total(run_id), 0)
            outcome.cut["budget"] += max(len(fresh) - room, 0)
            fresh = fresh[:room]
        by_host: dict[str, list[str]] = collections.defaultdict(list)
        for url in fresh:
            by_host[domain_of(url)].append(url)
        if options.max_pages_per_host != UNLIMITED and by_host:
            counts = self._state.host_counts(run_id, list(by_host))
            for host, host_urls in by_host.items():
                host_room = max(options.max_pages_per_host - counts.get(host, 0), 0)
                outcome.cut["budget"] += max(len(host_urls) - host_room, 0)
                del host_urls[host_room:]
        return {host: urls for host, urls in by_host.items() if urls}

    def _scope(self, run_id: str, options: DiscoveryOptions) -> Scope:
        scope = self._scopes.get(run_id)
        if scope is None:
            scope = self._scopes[run_id] = Scope(options)
        return scope
