"""The demo site's shape: its hosts, its pages and how they misbehave.

Everything the site serves is derived from one `SiteConfig`, so a test can compute what a crawl
of the site should find (`SiteConfig.expected()`) without reading the site at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

DEFAULT_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
DEFAULT_PORT = 8431
SITEMAP_INDEX_PATH = "/sitemap_index.xml"


class Kind(StrEnum):
    """A family of pages; the value is the first path segment (`/flaky/1.html`)."""

    PAGE = "pages"  # always 200
    NEWS = "news"  # always 200; news-style URLs
    FLAKY = "flaky"  # 500 for the first `flaky_failures` requests, then 200
    BROKEN = "broken"  # 500 until the site is fixed through the control endpoint
    MISSING = "missing"  # listed in the sitemaps, but 404
    DISALLOWED = "private"  # listed in the sitemaps and 200, but robots.txt disallows it


@dataclass(frozen=True)
class SiteConfig:
    # Addresses the servers listen on, one server each. Several loopback addresses stand in for
    # several domains, so per-domain politeness can be observed on one machine.
    hosts: tuple[str, ...] = DEFAULT_HOSTS
    port: int = DEFAULT_PORT  # 0 picks a free port when the site starts
    # Names used in URLs when they differ from the listen addresses (one container reached by
    # several network aliases). Empty: the URLs use `hosts`.
    public_names: tuple[str, ...] = ()
    pages_per_host: int = 20
    news_per_host: int = 3
    flaky_per_host: int = 2
    broken_per_host: int = 2
    missing_per_host: int = 2
    priority_per_host: int = 2  # the first pages of each host get sitemap priority 1.0
    duplicate_entries: int = 3  # extra sitemap entries spelling an already-listed URL differently
    flaky_failures: int = 2  # 500 answers a flaky page gives before it answers 200
    slow_ms: int = 0  # delay before every page answer, to make fetches overlap
    disallowed_per_host: int = 0  # pages a polite crawler records as skipped (robots.txt)
    invalid_entries: int = 0  # extra sitemap entries whose URL is not http(s): to be refused

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ValueError(problem)

    def _problem(self) -> str:
        if not self.hosts:
            return "at least one host is needed"
        if self.public_names and len(self.hosts) not in (1, len(self.public_names)):
            return "give one host (bound for every public name) or one host per public name"
        if not 0 <= self.port <= 65535:
            return f"port out of range: {self.port}"
        counts = {
            "pages_per_host": self.pages_per_host,
            "news_per_host": self.news_per_host,
            "flaky_per_host": self.flaky_per_host,
            "broken_per_host": self.broken_per_host,
            "missing_per_host": self.missing_per_host,
            "priority_per_host": self.priority_per_host,
            "duplicate_entries": self.duplicate_entries,
            "flaky_failures": self.flaky_failures,
            "slow_ms": self.slow_ms,
            "disallowed_per_host": self.disallowed_per_host,
            "invalid_entries": self.invalid_entries,
        }
        negative = [name for name, value in counts.items() if value < 0]
        if negative:
            return f"must not be negative: {', '.join(negative)}"
        if self.priority_per_host > self.pages_per_host:
            return "priority_per_host cannot exceed pages_per_host"
        if self.duplicate_entries > self.pages_per_host * len(self.names):
            return "duplicate_entries cannot exceed the number of normal pages"
        return ""

    @property
    def names(self) -> tuple[str, ...]:
        """The host names as they appear in URLs, one per site host."""
        return tuple(name.lower() for name in (self.public_names or self.hosts))

    def count(self, kind: Kind) -> int:
        return {
            Kind.PAGE: self.pages_per_host,
            Kind.NEWS: self.news_per_host,
            Kind.FLAKY: self.flaky_per_host,
            Kind.BROKEN: self.broken_per_host,
            Kind.MISSING: self.missing_per_host,
            Kind.DISALLOWED: self.disallowed_per_host,
        }[kind]

    def netloc(self, site: int) -> str:
        """`host:port` of site host number `site`, without the port when it is HTTP's default."""
        name = self.names[site]
        return name if self.port == 80 else f"{name}:{self.port}"

    def origin(self, site: int) -> str:
        return f"http://{self.netloc(site)}"

    def path(self, kind: Kind, number: int) -> str:
        return f"/{kind.value}/{number}.html"

    def url(self, site: int, kind: Kind, number: int) -> str:
        """The canonical URL of one page: lower case, no default port, no fragment."""
        return self.origin(site) + self.path(kind, number)

    def urls(self, kind: Kind) -> tuple[str, ...]:
        """Every URL of one kind, host by host, in page order."""
        return tuple(
            self.url(site, kind, number)
            for site in range(len(self.names))
            for number in range(1, self.count(kind) + 1)
        )

    @property
    def sitemap_index_url(self) -> str:
        """Only the first host serves sitemaps; robots.txt on that host points here."""
        return self.origin(0) + SITEMAP_INDEX_PATH

    def expected(self) -> ExpectedUrls:
        """What a crawl of the whole site should find."""
        news = self.urls(Kind.NEWS)
        priority = tuple(
            self.url(site, Kind.PAGE, number)
            for site in range(len(self.names))
            for number in range(1, self.priority_per_host + 1)
        )
        return ExpectedUrls(
            normal=self.urls(Kind.PAGE) + news,
            news=news,
            priority=priority,
            flaky=self.urls(Kind.FLAKY),
            broken=self.urls(Kind.BROKEN),
            missing=self.urls(Kind.MISSING),
            duplicates=self.duplicate_entries,
            disallowed=self.urls(Kind.DISALLOWED),
            invalid=self.invalid_entries,
        )


@dataclass(frozen=True)
class ExpectedUrls:
    """Canonical URLs listed in the sitemaps, by how the site answers them."""

    normal: tuple[str, ...]  # pages and news: 200 on the first request
    news: tuple[str, ...]  # the news subset of `normal`
    priority: tuple[str, ...]  # the subset of `normal` with sitemap priority 1.0
    flaky: tuple[str, ...]  # 500 at first, then 200
    broken: tuple[str, ...]  # 500 until fixed
    missing: tuple[str, ...]  # 404
    duplicates: int  # sitemap entries that canonicalise to a URL listed elsewhere
    disallowed: tuple[str, ...] = ()  # robots.txt disallows them
    invalid: int = 0  # sitemap entries that are no http(s) URL at all

    @property
    def unique(self) -> tuple[str, ...]:
        return self.normal + self.flaky + self.broken + self.missing + self.disallowed

    @property
    def unique_total(self) -> int:
        return len(self.unique)

    @property
    def sitemap_entries(self) -> int:
        """Every <loc> of the URL sitemaps, duplicates and invalid entries included."""
        return self.unique_total + self.duplicates + self.invalid
