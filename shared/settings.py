"""Settings: one frozen dataclass, read from the environment once, in each entry point's main().

Every field is set by the environment variable of the same name in upper case
(``rate_limit_rps`` ← ``RATE_LIMIT_RPS``). `.env.example` lists them all; a test keeps the two
in step. Units are in the names.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import socket
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from shared.errors import ConfigError, one_line
from shared.message_bounds import QUEUE_KINDS
from shared.redis.cluster import cluster_nodes, is_cluster_url
from shared.settings_file import FILE_VARIABLE, blamed_on_file, read_settings_file

# The schemes each service URL may have; anything else is a mistake to report before connecting.
URL_SCHEMES = {
    "amqp_url": ("amqp", "amqps"),
    "redis_url": ("redis", "rediss", "unix"),  # or redis+cluster:// (shared/redis/cluster.py)
    "database_url": ("postgresql", "postgres"),
    "rabbitmq_management_url": ("http", "https"),
}
FILE_SETTINGS = ("politeness_file", "extraction_profiles_file", "routing_file")
MAX_RULES_FILE_BYTES = 10 * 1024 * 1024
# The settings checked by value alone, by what each must be.
AT_LEAST_ONE = (
    "max_attempts",
    "fetch_concurrency",
    "worker_processes",
    "max_redirects",
    "max_body_bytes",
    "publish_batch_size",
    "parse_max_nodes",
    "parse_max_depth",
    "max_concurrent_per_domain",
    "proxy_max_failures",
    "warc_max_bytes",
    "renderer_processes",
    "render_concurrency",
    "browser_max_pages",
    "browser_max_rss_mb",
    "render_page_heap_mb",
)
POSITIVE = (
    "ttl_queue_expiry_s",
    "fetch_connect_timeout_s",
    "fetch_read_timeout_s",
    "fetch_deadline_s",
    "cache_ttl_s",
    "rate_limit_rps",
    "robots_ttl_s",
    "proxy_bench_s",
    "max_domain_pause_s",
    "parse_deadline_s",
    "rate_recovery_s",
    "render_deadline_s",
)
NOT_NEGATIVE = (
    "heartbeat_s",
    "max_inline_wait_s",
    "max_hold_s",
    "max_sitemap_depth",
    "cache_max_body_bytes",
    "host_spread_window",
    "cache_fresh_s",
    "metrics_linger_s",
    "rate_jitter",
)
# Each test holds for the values allowed, so a NaN (which compares false) is refused too.
_BOUNDS: tuple[tuple[tuple[str, ...], Callable[[float], bool], str], ...] = (
    (AT_LEAST_ONE, lambda value: value >= 1, "must be at least 1"),
    (POSITIVE, lambda value: value > 0, "must be positive"),
    (NOT_NEGATIVE, lambda value: value >= 0, "must be 0 or more"),
)
CHOICES = {
    "queue_type": ("classic", "quorum"),
    "proxy_rotation": ("round_robin", "random"),
    "log_format": ("text", "json"),
    "database_pooler": ("none", "transaction"),
    "render": ("off", "auto"),
}
# Names that become parts of queue names, Redis keys and a PostgreSQL schema name.
NAME_SETTINGS = ("crawl_namespace", "redis_prefix", "pg_schema")
# A password in a URL's user info (up to its last '@'), or given as a libpq parameter.
_PASSWORDS = (re.compile(r"(://[^/@:]*:)[^/]*@"), re.compile(r"(password=)[^&\s]*", re.IGNORECASE))
# Fetches in flight per worker process. Most of a fetch is waiting for the site, so a worker
# holds many: on a site answering in 100 ms, a pool of 4 workers made 705 pages/s at 24 each
# and 540 at 16, at the same CPU a page (docs/PERFORMANCE.md). `make crawl`, compose and the
# benchmark's row for `make crawl` all take this default.
DEFAULT_FETCH_CONCURRENCY = 24


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Settings:
    # Where the services are. The defaults work on a developer machine with local services.
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/%2f"
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/crawler"
    rabbitmq_management_url: str = "http://127.0.0.1:15672"

    # Names: change these to run several independent pipelines against the same services.
    crawl_namespace: str = "crawl"  # prefix of every queue and exchange
    redis_prefix: str = "crawl"  # prefix of every Redis key
    pg_schema: str = "crawl"  # PostgreSQL schema holding the tables
    # What stands between us and PostgreSQL: none (direct connections) or transaction (a pooler
    # such as PgBouncer in transaction mode, docs/SCALING.md), which keeps no session state:
    # no prepared statements, and the schema is set inside every transaction.
    database_pooler: str = "none"

    # Queues.
    queue_type: str = "classic"  # classic | quorum (the priority queue stays classic)
    ttl_queue_expiry_s: float = 3600.0  # a URL waiting longer than this in the ttl queue expires
    retry_delays_s: tuple[float, ...] = (5.0, 30.0)  # wait before attempt 2, attempt 3, ...
    max_attempts: int = 3
    heartbeat_s: int = 20

    # Worker.
    worker_id: str = field(default_factory=default_worker_id)
    fetch_concurrency: int = DEFAULT_FETCH_CONCURRENCY  # fetches in flight per worker process
    worker_processes: int = 1  # `python -m worker` forks this many workers (worker/pool.py)
    # The work queues a worker serves: all by default; "priority" alone for a dedicated pool.
    worker_queues: tuple[str, ...] = ("priority", "ttl", "bulk")
    fetch_connect_timeout_s: float = 5.0
    fetch_read_timeout_s: float = 15.0
    fetch_deadline_s: float = 30.0  # whole fetch, body included
    max_body_bytes: int = 5_000_000
    max_redirects: int = 5
    # What parsing one page may cost (docs/SECURITY.md); past it the page is dead, `parse_limit`.
    parse_max_nodes: int = 75_000  # elements + attributes + strings + comments
    parse_max_depth: int = 512  # elements open at once
    parse_deadline_s: float = 5.0
    # Address guard (docs/SECURITY.md): refuse loopback, private, link-local and other internal
    # addresses, except the comma-separated CIDR networks and host names allowed here.
    block_private_addresses: bool = True
    fetch_allowlist: str = ""  # e.g. "10.1.0.0/16,intranet.example,.corp.example"
    user_agent: str = "crawl-pipeline/0.1 (+https://github.com/crawl-pipeline)"
    rate_limit_rps: float = 2.0  # per domain, shared by every worker
    # Adaptive slow-down (docs/POLITENESS.md): a domain's rate is cut on a 429 or 503 without
    # Retry-After, a burst of 403s or rising latency, and grows back to RATE_LIMIT_RPS over this
    # long. RATE_JITTER lengthens each interval by a random share of it, up to this (0.5 = up
    # to half again), so requests are not evenly spaced; 0 = none.
    rate_recovery_s: float = 60.0
    rate_jitter: float = 0.0
    max_inline_wait_s: float = 2.0  # a longer rate-limit wait frees the fetch thread
    # A URL that must wait longer than the inline wait is held unacked in the worker for up to
    # this long (its domain slot reserved); longer waits go back through the broker. 0 = never hold.
    max_hold_s: float = 300.0
    cache_enabled: bool = True
    cache_ttl_s: float = 86400.0
    cache_max_body_bytes: int = 1_000_000
    # Pages built by scripts (docs/RENDERING.md). RENDER=auto: a page the worker fetched that
    # looks like a script shell goes to the render queue instead of being stored.
    render: str = "off"  # off | auto
    chromium_path: str = "/usr/bin/chromium"
    renderer_processes: int = 1  # `python -m renderer` forks this many renderers, one browser each
    render_concurrency: int = 4  # pages in flight per renderer, each in a context of its own
    render_deadline_s: float = 20.0  # one page's whole render; the wait for network idle included
    browser_max_pages: int = 100  # pages one context renders before it is replaced
    browser_max_rss_mb: int = 1024  # a browser past this (all its processes) is restarted
    render_page_heap_mb: int = 256  # V8's heap cap for a page: past it the page crashes
    # Politeness (docs/POLITENESS.md).
    politeness_file: str = ""  # TOML per-domain overrides; empty = the defaults for every domain
    max_concurrent_per_domain: int = 8  # requests in flight per domain, shared by every worker
    max_domain_pause_s: float = 3600.0  # longest pause a Retry-After header can impose
    respect_robots: bool = True
    robots_ttl_s: float = 3600.0  # how long a fetched robots.txt is trusted
    cache_fresh_s: float = 0.0  # a cached page younger than this is used unchecked; 0 = revalidate
    # Comma-separated proxy URLs, perhaps with credentials: kept out of repr() so that logging
    # the settings cannot leak them. Empty = connect directly.
    proxies: str = field(default="", repr=False)
    proxy_file: str = ""  # one proxy URL a line, beside PROXIES (shared/http/proxies.py)
    proxy_rotation: str = "round_robin"  # round_robin | random
    proxy_max_failures: int = 3  # failures within proxy_bench_s that bench a proxy
    proxy_bench_s: float = 300.0  # how long a benched proxy stays out of use, for every worker
    extraction_profiles_file: str = ""  # TOML: CSS fields per URL pattern (worker/parse/profiles.py)
    # WARC records of every page (docs/WARC.md): the folder each worker process writes its files
    # in; empty = no WARC. A file is closed and the next begun past warc_max_bytes.
    warc_dir: str = ""
    warc_max_bytes: int = 1_000_000_000

    # Producer.
    routing_file: str = ""  # TOML routing rules; empty = the built-in rules
    max_sitemap_depth: int = 3
    max_sitemap_bytes: int = 50 * 1024 * 1024  # decompressed, per sitemap file
    publish_batch_size: int = 500
    # URLs read ahead and published one host at a time in turn (producer/spread.py); 0 = as read.
    host_spread_window: int = 10_000

    # Operating.
    log_level: str = "INFO"
    log_format: str = "text"  # text | json (one JSON object per line, for log collectors)
    metrics_port: int = 0  # serve Prometheus metrics on this port; 0 = no metrics server
    # Loopback by default so that a developer machine exposes nothing; containers set 0.0.0.0
    # so that Prometheus can reach them over the container network.
    metrics_host: str = "127.0.0.1"
    # A producer serving metrics stays up after its run until its final figures have been scraped
    # once, for at most this long: a scrape every 15 s, found by a DNS refresh every 15 s, needs
    # up to 30 s to see a new producer at all. 0 = exit at once.
    metrics_linger_s: float = 60.0
    # A TOML file of these settings under their variables' names; the environment wins over it.
    crawl_settings_file: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from `environ` (default: os.environ); raise ConfigError naming the variable."""
        env = os.environ if environ is None else environ
        hints = get_type_hints(cls)
        names = {f.name.upper() for f in dataclasses.fields(cls)}
        # CRAWL_SETTINGS_FILE (shared/settings_file.py): the environment wins over the file.
        path = env.get(FILE_VARIABLE, "")
        in_file = read_settings_file(path, names) if path else {}
        values: dict[str, Any] = {}
        from_file: set[str] = set()
        for f in dataclasses.fields(cls):
            name = f.name.upper()
            raw = env.get(name)
            if (raw is None or raw == "") and in_file.get(name, "") != "":
                raw = in_file[name]
                from_file.add(name)
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f"{path}: {name}" if name in from_file else name, raw, hints[f.name])
        settings = cls(**values)
        try:
            settings.validate()
        except ConfigError as exc:
            raise blamed_on_file(exc, path, from_file) from None
        return settings

    def validate(self) -> None:
        """Refuse settings that cannot work, with a one-line ConfigError naming the variable."""
        _check_values(self)
        if not self.worker_queues or not set(self.worker_queues) <= set(QUEUE_KINDS):
            kinds = ",".join(self.worker_queues)
            raise ConfigError(f"WORKER_QUEUES: expected some of {','.join(QUEUE_KINDS)}, got {kinds!r}")
        if not self.retry_delays_s or any(d <= 0 for d in self.retry_delays_s):
            raise ConfigError("RETRY_DELAYS_S: expected positive seconds, e.g. '5,30'")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"METRICS_PORT: expected 0 (off) or a TCP port, got {self.metrics_port}")
        if self.log_level.upper() not in logging.getLevelNamesMapping():
            raise ConfigError(f"LOG_LEVEL: expected DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}")
        if self.fetch_allowlist.strip():
            # Imported here: the guard pulls in requests, which settings alone do not need.
            from shared.http.addresses import parse_allowlist

            parse_allowlist(self.fetch_allowlist)  # raises ConfigError naming a bad entry
        _check_service_urls(self)
        _check_with_client_libraries(self)
        for name in FILE_SETTINGS:
            if getattr(self, name):
                _check_toml_file(name.upper(), getattr(self, name))

    def retry_delay_s(self, attempt: int) -> float:
        """Delay before the attempt after `attempt` failed ones (1-based); the last delay repeats."""
        return self.retry_delays_s[min(attempt, len(self.retry_delays_s)) - 1]


def _check_service_urls(settings: Settings) -> None:
    """AMQP_URL (one node or several), REDIS_URL (one server or a cluster) and DATABASE_URL."""
    if not amqp_urls(settings.amqp_url):
        raise ConfigError("AMQP_URL: no URL given; expected amqp://... (several separated by commas)")
    for name, schemes in URL_SCHEMES.items():
        if name == "redis_url" and is_cluster_url(settings.redis_url):
            cluster_nodes(settings.redis_url)  # raises ConfigError naming a bad node
            continue
        for url in amqp_urls(settings.amqp_url) if name == "amqp_url" else [getattr(settings, name)]:
            _check_url(name.upper(), url, schemes)


def _check_values(settings: Settings) -> None:
    """The checks that need nothing but the value: bounds, choices and names."""
    for names, holds, requirement in _BOUNDS:
        for name in names:
            value = getattr(settings, name)
            if not holds(value):
                raise ConfigError(f"{name.upper()}: {requirement}, got {value}")
    for name, choices in CHOICES.items():
        value = getattr(settings, name)
        if value not in choices:
            expected = " or ".join(repr(choice) for choice in choices)
            raise ConfigError(f"{name.upper()}: expected {expected}, got {value!r}")
    for name in NAME_SETTINGS:
        value = getattr(settings, name)
        if not value.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"{name.upper()}: use letters, digits, '-' or '_', got {value!r}")


def _parse(name: str, raw: str, hint: Any) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        hint = next(a for a in get_args(hint) if a is not type(None))
        origin = get_origin(hint)
    try:
        if origin is tuple:
            (item_type, _) = get_args(hint)
            hint = f"comma-separated {item_type.__name__}s"
            items = tuple(item_type(part.strip()) for part in raw.split(",") if part.strip())
            if any(isinstance(item, float) and not math.isfinite(item) for item in items):
                raise ValueError(raw)
            return items
        if hint is bool:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if hint is float and not math.isfinite(float(raw.strip())):
            raise ValueError(raw)
        return hint(raw.strip()) if hint in (int, float) else raw
    except ValueError:
        kind = getattr(hint, "__name__", str(hint))
        raise ConfigError(f"{name}: expected {kind}, got {raw[:80]!r}") from None


def _check_url(name: str, url: str, schemes: tuple[str, ...]) -> None:
    """A service URL that cannot work, refused with its password masked."""
    expected = " or ".join(f"{scheme}://" for scheme in schemes)
    if name == "DATABASE_URL" and "://" not in url and "=" in url:
        return  # a libpq key=value string (host=... dbname=...): libpq itself reads it
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        raise ConfigError(f"{name}: cannot parse {redact(url)!r}; expected {expected}...") from None
    if parts.scheme not in schemes:
        raise ConfigError(f"{name}: expected a URL starting {expected}, got {redact(url)!r}")
    if parts.scheme != "unix" and not parts.hostname and name != "DATABASE_URL":
        raise ConfigError(f"{name}: no host in {redact(url)!r}")


def _check_toml_file(name: str, path: str) -> None:
    """A rules file that cannot be read as TOML, refused before any service is contacted; what
    its tables mean is checked by the module that reads it."""
    import tomllib

    if not os.path.isfile(path):
        raise ConfigError(f"{name}: {path!r} is not a file")
    if os.path.getsize(path) > MAX_RULES_FILE_BYTES:
        raise ConfigError(f"{name}: {path!r} is over {MAX_RULES_FILE_BYTES} bytes; not a rules file")
    try:
        with open(path, encoding="utf-8") as file:
            tomllib.loads(file.read())
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path!r} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: {path!r} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: {path!r} is not valid TOML ({exc})") from None


def _check_with_client_libraries(settings: Settings) -> None:
    """What the client libraries would refuse when connecting (a bad query option, a database
    number that is not a number), refused now, in one line. Imported here: settings alone do
    not need them."""
    import pika
    import psycopg
    import redis

    checks: tuple[tuple[str, str, Any], ...] = (
        *(("AMQP_URL", url, pika.URLParameters) for url in amqp_urls(settings.amqp_url)),
        *(
            ()
            if is_cluster_url(settings.redis_url)
            else (("REDIS_URL", settings.redis_url, redis.connection.parse_url),)
        ),
        ("DATABASE_URL", settings.database_url, psycopg.conninfo.conninfo_to_dict),
    )
    for name, url, parse in checks:
        try:
            parse(url)
        except Exception as exc:  # each library has its own errors; none may reach the user raw
            detail = redact(one_line(exc))
            raise ConfigError(f"{name}: {redact(url)!r} is not usable: {detail[:200]}") from None


def amqp_urls(amqp_url: str) -> list[str]:
    """The broker nodes AMQP_URL names: one URL, or several separated by commas for the nodes of
    a cluster (a comma inside a password is written %2C). Clients connect to whichever answers."""
    return [url.strip() for url in amqp_url.split(",") if url.strip()]


def redact(url: str) -> str:
    """The URL with any password replaced, for log lines and error messages. Works on text that
    does not parse as a URL too: a mistake in a URL must not print its password."""
    url = _PASSWORDS[0].sub(r"\1***@", url)
    return _PASSWORDS[1].sub(r"\1***", url)
