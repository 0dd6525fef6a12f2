"""What a discovery crawl follows: its start URLs, depth, scope, patterns and budgets.

A run discovers when it is given start URLs (`--start`) or a depth (`--max-depth`): its start
and sitemap URLs are depth 0, and the links of a page at depth d are depth d + 1. The options are
checked once, before anything is queued (`DiscoveryOptions.checked`): a start URL that is
malformed, not http(s) or behind the address guard, a pattern that does not compile or a
negative number is a ConfigError naming it. The producer keeps them in Redis for the run
(Keys.run_discovery), where the frontier reads them (producer/frontier.py).

Scopes, judged on canonical URLs against the start URLs (or the sitemap and site URLs of a run
without start URLs):
    host    the same host and port as a start URL (the default);
    domain  a start URL's host with a leading "www." dropped, and every host under it
            (no public-suffix list: a start URL on "co.uk" would take in all of co.uk);
    prefix  URLs that begin with a start URL, up to its last "/".
`--include` patterns (any one must match, when there are some) and `--exclude` patterns (none
may match) are searched in the canonical URL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.crawl_request import DISCOVERY_SCOPES
from shared.errors import BlockedAddress, ConfigError
from shared.urls import InvalidURL, canonicalize, domain_of

SCOPES = DISCOVERY_SCOPES  # named once, with the crawl request's vocabulary
DEFAULT_SCOPE = "host"
DEFAULT_MAX_DEPTH = 3  # when start URLs are given without a depth
DEFAULT_MAX_PAGES = 100_000  # a whole run's URLs, sitemap URLs included: bounds a trap
UNLIMITED = 0  # --max-pages-per-host 0 (the default): no bound per host beyond --max-pages


@dataclass(frozen=True)
class DiscoveryOptions:
    start_urls: tuple[str, ...] = ()  # canonical
    max_depth: int = DEFAULT_MAX_DEPTH
    scope: str = DEFAULT_SCOPE
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_pages: int = DEFAULT_MAX_PAGES
    max_pages_per_host: int = UNLIMITED
    roots: tuple[str, ...] = ()  # what the scope is judged against: start URLs, else sitemap URLs

    @classmethod
    def checked(
        cls,
        start_urls: Sequence[str],
        max_depth: int | None,
        scope: str = DEFAULT_SCOPE,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        max_pages: int = DEFAULT_MAX_PAGES,
        max_pages_per_host: int = UNLIMITED,
        other_roots: Sequence[str] = (),
        check_address: Callable[[str], None] | None = None,
    ) -> DiscoveryOptions | None:
        """The options of a discovery run, or None for a run that follows no links (no start
        URL, no depth). ConfigError, naming what is wrong, for anything that cannot be used."""
        if not start_urls and max_depth is None:
            return None
        if max_depth is not None and max_depth < 0:
            raise ConfigError(f"--max-depth {max_depth}: must be 0 or more")
        for name, number in (("--max-pages", max_pages), ("--max-pages-per-host", max_pages_per_host)):
            if number < 0:
                raise ConfigError(f"{name} {number}: must be 0 or more")
        if scope not in SCOPES:
            raise ConfigError(f"--scope {scope!r}: expected one of {', '.join(SCOPES)}")
        for name, patterns in (("--include", include), ("--exclude", exclude)):
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ConfigError(f"{name} {pattern!r}: not a regular expression ({exc})") from None
        starts = tuple(dict.fromkeys(_start_url(url, check_address) for url in start_urls))
        roots = starts or tuple(root for url in other_roots if (root := _root(url)) is not None)
        return cls(
            start_urls=starts,
            max_depth=DEFAULT_MAX_DEPTH if max_depth is None else max_depth,
            scope=scope,
            include=tuple(include),
            exclude=tuple(exclude),
            max_pages=max_pages,
            max_pages_per_host=max_pages_per_host,
            roots=roots,
        )

    def encode(self) -> bytes:
        return json.dumps(
            {
                "start_urls": self.start_urls,
                "max_depth": self.max_depth,
                "scope": self.scope,
                "include": self.include,
                "exclude": self.exclude,
                "max_pages": self.max_pages,
                "max_pages_per_host": self.max_pages_per_host,
                "roots": self.roots,
            }
        ).encode()

    @classmethod
    def decode(cls, body: bytes) -> DiscoveryOptions:
        data = json.loads(body)
        return cls(
            start_urls=tuple(data["start_urls"]),
            max_depth=int(data["max_depth"]),
            scope=str(data["scope"]),
            include=tuple(data["include"]),
            exclude=tuple(data["exclude"]),
            max_pages=int(data["max_pages"]),
            max_pages_per_host=int(data["max_pages_per_host"]),
            roots=tuple(data["roots"]),
        )


def _start_url(url: str, check_address: Callable[[str], None] | None) -> str:
    try:
        canonical = canonicalize(url)
    except InvalidURL as exc:
        raise ConfigError(f"--start {url!r}: {exc.detail}") from None
    if check_address is not None:
        try:
            check_address(canonical)
        except BlockedAddress as exc:
            raise ConfigError(f"--start {url!r}: {exc.detail}") from None
    return canonical


def _root(url: str) -> str | None:
    """A sitemap's or site's URL as a scope root; None for a local file."""
    try:
        return canonicalize(url)
    except InvalidURL:
        return None


class Scope:
    """Whether a canonical URL is within a run's scope and patterns."""

    def __init__(self, options: DiscoveryOptions) -> None:
        self._kind = options.scope
        self._hosts = frozenset(domain_of(root) for root in options.roots)
        self._domains = tuple(sorted({_without_www(urlsplit(root).hostname or "") for root in options.roots}))
        self._prefixes = tuple(sorted({root[: root.rindex("/") + 1] for root in options.roots}))
        self._include = [re.compile(p) for p in options.include]
        self._exclude = [re.compile(p) for p in options.exclude]

    def admits(self, canonical: str) -> bool:
        return self._within(canonical) and self._matches(canonical)

    def _within(self, canonical: str) -> bool:
        if self._kind == "host":
            return domain_of(canonical) in self._hosts
        if self._kind == "prefix":
            return canonical.startswith(self._prefixes)
        host = urlsplit(canonical).hostname or ""
        return any(host == domain or host.endswith("." + domain) for domain in self._domains)

    def _matches(self, canonical: str) -> bool:
        if self._include and not any(p.search(canonical) for p in self._include):
            return False
        return not any(p.search(canonical) for p in self._exclude)


def _without_www(host: str) -> str:
    return host[4:] if host.startswith("www.") and host.count(".") >= 2 else host
