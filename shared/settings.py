"""Settings: one frozen dataclass, read from the environment once, in each entry point's main().

Every field is set by the environment variable of the same name in upper case
(``rate_limit_rps`` ← ``RATE_LIMIT_RPS``). `.env.example` lists them all; a test keeps the two
in step. Units are in the names.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints

from shared.errors import ConfigError


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

    # Queues.
    queue_type: str = "classic"  # classic | quorum (the priority queue stays classic)
    ttl_queue_expiry_s: float = 3600.0  # a URL waiting longer than this in the ttl queue expires
    retry_delays_s: tuple[float, ...] = (5.0, 30.0)  # wait before attempt 2, attempt 3, ...
    max_attempts: int = 3
    heartbeat_s: int = 20

    # Worker.
    worker_id: str = field(default_factory=default_worker_id)
    fetch_concurrency: int = 8  # fetches in flight per worker process
    worker_processes: int = 1  # `python -m worker` forks this many workers (worker/pool.py)
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
    max_inline_wait_s: float = 2.0  # a longer rate-limit wait goes back through the broker
    cache_enabled: bool = True
    cache_ttl_s: float = 86400.0
    cache_max_body_bytes: int = 1_000_000
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
    proxy_rotation: str = "round_robin"  # round_robin | random
    proxy_max_failures: int = 3  # failures within proxy_bench_s that bench a proxy
    proxy_bench_s: float = 300.0  # how long a benched proxy stays out of use, for every worker
    extraction_profiles_file: str = ""  # TOML: CSS fields per URL pattern (worker/profiles.py)

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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from `environ` (default: os.environ); raise ConfigError naming the variable."""
        env = os.environ if environ is None else environ
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f.name.upper()
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(name, raw, hints[f.name])
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.queue_type not in ("classic", "quorum"):
            raise ConfigError(f"QUEUE_TYPE: expected 'classic' or 'quorum', got {self.queue_type!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"MAX_ATTEMPTS: must be at least 1, got {self.max_attempts}")
        if not self.retry_delays_s or any(d <= 0 for d in self.retry_delays_s):
            raise ConfigError("RETRY_DELAYS_S: expected positive seconds, e.g. '5,30'")
        for name in (
            "fetch_concurrency",
            "worker_processes",
            "max_redirects",
            "max_body_bytes",
            "publish_batch_size",
            "parse_max_nodes",
            "parse_max_depth",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.upper()}: must be at least 1")
        if self.rate_limit_rps <= 0:
            raise ConfigError(f"RATE_LIMIT_RPS: must be positive, got {self.rate_limit_rps}")
        if self.max_concurrent_per_domain < 1 or self.proxy_max_failures < 1:
            raise ConfigError("MAX_CONCURRENT_PER_DOMAIN and PROXY_MAX_FAILURES: must be at least 1")
        for name in ("robots_ttl_s", "proxy_bench_s", "max_domain_pause_s", "parse_deadline_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.upper()}: must be positive")
        if self.host_spread_window < 0:
            raise ConfigError(f"HOST_SPREAD_WINDOW: must be 0 or more, got {self.host_spread_window}")
        if self.cache_fresh_s < 0:
            raise ConfigError(f"CACHE_FRESH_S: must be 0 or more, got {self.cache_fresh_s}")
        if self.proxy_rotation not in ("round_robin", "random"):
            raise ConfigError(
                f"PROXY_ROTATION: expected 'round_robin' or 'random', got {self.proxy_rotation!r}"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"LOG_FORMAT: expected 'text' or 'json', got {self.log_format!r}")
        if self.metrics_linger_s < 0:
            raise ConfigError(f"METRICS_LINGER_S: must be 0 or more, got {self.metrics_linger_s}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"METRICS_PORT: expected 0 (off) or a TCP port, got {self.metrics_port}")
        if self.fetch_allowlist.strip():
            # Imported here: the guard pulls in requests, which settings alone do not need.
            from shared.netguard import parse_allowlist

            parse_allowlist(self.fetch_allowlist)  # raises ConfigError naming a bad entry
        for name in ("crawl_namespace", "redis_prefix", "pg_schema"):
            value = getattr(self, name)
            if not value.replace("_", "").replace("-", "").isalnum():
                raise ConfigError(f"{name.upper()}: use letters, digits, '-' or '_', got {value!r}")

    def retry_delay_s(self, attempt: int) -> float:
        """Delay before the attempt after `attempt` failed ones (1-based); the last delay repeats."""
        return self.retry_delays_s[min(attempt, len(self.retry_delays_s)) - 1]


def _parse(name: str, raw: str, hint: Any) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        hint = next(a for a in get_args(hint) if a is not type(None))
        origin = get_origin(hint)
    try:
        if origin is tuple:
            (item_type, _) = get_args(hint)
            return tuple(item_type(part.strip()) for part in raw.split(",") if part.strip())
        if hint is bool:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return hint(raw.strip()) if hint in (int, float) else raw
    except ValueError:
        kind = getattr(hint, "__name__", str(hint))
        raise ConfigError(f"{name}: expected {kind}, got {raw!r}") from None


def redact(url: str) -> str:
    """The URL with any password replaced, for log lines and error messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
