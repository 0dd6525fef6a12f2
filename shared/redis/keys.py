"""Every Redis key the pipeline writes, built here and nowhere else.

With the default prefix ``crawl``, ``redis-cli --scan --pattern 'crawl:*'`` lists them:

    crawl:seen:{<run>:<bb>}<bb'>     hash   dedup fingerprints of one run (field = fingerprint tail);
                                            bucket = 4 hex digits, the first two in the hash tag
    crawl:run:<run>:stats            hash   counters of one run (enqueued.<queue>, retries, cache_hits, ...)
    crawl:run:<run>:producer:<owner> string present while producer process <owner> is alive (expires)
    crawl:run:{<run>:<bb>}:producer:<owner>  the same, one per bucket group, on a Redis Cluster
    crawl:run:<run>:state            string paused | cancelled (ops/runs.py); absent: running
    crawl:run:<run>:seeded           string the summary of the run's completed seeding (producer --once)
    crawl:run:<run>:discovery        string a discovery run's start URLs, depth, scope and budgets
    crawl:run:<run>:discovered-hosts hash   URLs the frontier has enqueued, per host (--max-pages-per-host)
    crawl:run:<run>:frontier         hash   frontier owner -> epoch ms deadline, while it holds a run's page
    crawl:rate:{<domain>}            string GCRA theoretical arrival time of a domain (expires)
    crawl:cache:<fingerprint>        string cached response (expires after CACHE_TTL_S)
    crawl:sent:{<domain>}            string server time of the domain's latest request, µs (expires):
                                            when it was cleared, or may go (a held send cleared
                                            ahead), or was answered (robots.txt)
    crawl:pause:{<domain>}           string the domain asked us to stay away (Retry-After; expires)
    crawl:backoff:{<domain>}         hash   interval multiplier after 429/503 without Retry-After (expires)
    crawl:inflight:{<domain>}        zset   concurrency leases: member = lease id, score = its expiry
    crawl:robots:<domain>            string the domain's robots.txt verdict and text (expires)
    crawl:robots-lock:<domain>       string held by the one worker fetching robots.txt (expires)
    crawl:proxy-failures:{<proxy>}   string recent failures of a proxy (expires)
    crawl:proxy-bench:{<proxy>}      string present while a proxy is benched (expires)
    crawl:deliveries:{<message>}     string redeliveries of one message, to bound a crash loop (expires)
    crawl:handling:{<message>}       string a handler has started on this message (expires)
    crawl:worker:<worker id>         string a running worker's presence, for status (expires)

The part in {braces} is a hash tag: on a Redis Cluster only it picks the key's slot, so the keys
one Lua script touches share a slot (shared/redis/cluster.py): a domain's rate-limit keys, a
message's two poison keys, a proxy's two keys, and the dedup hashes of one run and bucket group
(with that group's producer heartbeats). In standalone mode the braces are just characters.

Only the keys marked (expires) expire. Dedup and run counters are state: run Redis with
``maxmemory-policy noeviction`` (or keep the cache in another database) so eviction never
forgets them.
"""

from __future__ import annotations


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def seen(self, run_id: str, bucket: str) -> str:
        return f"{self.prefix}:seen:{{{run_id}:{bucket[:2]}}}{bucket[2:]}"

    def run_stats(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:stats"

    def run_state(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:state"

    def run_seeded(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:seeded"

    def run_discovery(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:discovery"

    def run_discovered_hosts(self, run_id: str) -> str:
        return f"{self.prefix}:run:{run_id}:discovered-hosts"

    def run_frontier(self, run_id: str) -> str:
        """Which frontiers hold a page of the run now (producer/frontier_redis.py, PagesInHand):
        the run's total may still grow while one does, though no link waits in its queue."""
        return f"{self.prefix}:run:{run_id}:frontier"

    def run_stats_pattern(self) -> str:
        return f"{self.prefix}:run:*:stats"

    def run_producing(self, run_id: str) -> str:
        """Present while any producer of the run beats (each beat renews it; it expires like a
        heartbeat): "is the run still being seeded?" in one GET, without a scan."""
        return f"{self.prefix}:run:{run_id}:producing"

    def producer_heartbeat(self, run_id: str, owner: str, group: str = "") -> str:
        """Alive while the producer process `owner` runs; its claims are taken over once gone.
        On a Redis Cluster there is one per bucket `group`, in the slot of that group's hashes,
        for the claim script to read."""
        if group:
            return f"{self.prefix}:run:{{{run_id}:{group}}}:producer:{owner}"
        return f"{self.prefix}:run:{run_id}:producer:{owner}"

    def rate(self, domain: str) -> str:
        return f"{self.prefix}:rate:{{{domain}}}"

    def cache(self, fingerprint_hex: str) -> str:
        return f"{self.prefix}:cache:{fingerprint_hex}"

    def sent(self, domain: str) -> str:
        return f"{self.prefix}:sent:{{{domain}}}"

    def pause(self, domain: str) -> str:
        return f"{self.prefix}:pause:{{{domain}}}"

    def backoff(self, domain: str) -> str:
        return f"{self.prefix}:backoff:{{{domain}}}"

    def inflight(self, domain: str) -> str:
        return f"{self.prefix}:inflight:{{{domain}}}"

    def robots(self, domain: str) -> str:
        return f"{self.prefix}:robots:{domain}"

    def robots_lock(self, domain: str) -> str:
        return f"{self.prefix}:robots-lock:{domain}"

    def proxy_failures(self, proxy: str) -> str:
        """`proxy` is the proxy's address without credentials (scheme://host:port)."""
        return f"{self.prefix}:proxy-failures:{{{proxy}}}"

    def proxy_bench(self, proxy: str) -> str:
        return f"{self.prefix}:proxy-bench:{{{proxy}}}"

    def handling(self, message_fp: str) -> str:
        """Set while a handler works on the message; a crash leaves it behind (expires)."""
        return f"{self.prefix}:handling:{{{message_fp}}}"

    def deliveries(self, message_fp: str) -> str:
        """`message_fp` is worker.handling.poison.message_fingerprint of the message."""
        return f"{self.prefix}:deliveries:{{{message_fp}}}"

    def worker(self, worker_id: str) -> str:
        """Present while the worker runs (shared/redis/presence.py)."""
        return f"{self.prefix}:worker:{worker_id}"

    def worker_pattern(self) -> str:
        return f"{self.prefix}:worker:*"

    def all_pattern(self) -> str:
        return f"{self.prefix}:*"
