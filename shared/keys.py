"""Every Redis key the pipeline writes, built here and nowhere else.

With the default prefix ``crawl``, ``redis-cli --scan --pattern 'crawl:*'`` lists them:

    crawl:seen:<run>:<bucket>    hash   dedup fingerprints of one run (field = fingerprint tail)
    crawl:run:<run>:stats        hash   counters of one run (enqueued.<queue>, retries, cache_hits, ...)
    crawl:rate:<domain>          string GCRA theoretical arrival time of a domain (expires)
    crawl:cache:<fingerprint>    string cached response (expires after CACHE_TTL_S)

Only cache and rate keys expire. Dedup and run counters are state: run Redis with
``maxmemory-policy noeviction`` (or keep the cache in another database) so eviction never
forgets them.
"""

from __future__ import annotations


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def seen(self, run_id: str, bucket: str) -> str:
        return f"{self.prefix}:seen:{run_id}:{bucket}"

    def seen_pattern(self, run_id: str) -> str:
        return f"{self.prefix}:seen:{run_id}:*"

    def run_stats(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:stats"

    def rate(self, domain: str) -> str:
        return f"{self.prefix}:rate:{domain}"

    def cache(self, fingerprint_hex: str) -> str:
        return f"{self.prefix}:cache:{fingerprint_hex}"

    def all_pattern(self) -> str:
        return f"{self.prefix}:*"
