"""Bytes per URL of the producer's dedup state, measured in a private Redis with INFO memory.

A private redis-server (unix socket, no persistence, default encodings) keeps other Redis users
out of the figure. URLs go through the producer's own claim and confirm scripts, in batches,
exactly as a crawl would store them.

`python -m bench.dedup_memory COUNT [redis+cluster://...]` prints the figure; with a cluster URL
(e.g. the one `make redis-cluster-up` starts, used by nothing else) it is measured there instead:
the growth of used_memory summed over the primaries, under a run id of its own, removed after.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from producer.dedup import Dedup
from shared.redis.keys import Keys
from shared.urls import fingerprint

BATCH = 2_000


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def dedup_bytes_per_url(count: int) -> float:
    with tempfile.TemporaryDirectory(prefix="dedup-redis-") as tmp:
        socket_path = str(Path(tmp) / "redis.sock")
        server = subprocess.Popen(
            [
                "redis-server",
                "--port",
                "0",
                "--unixsocket",
                socket_path,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(unix_socket_path=socket_path)
            for _ in range(100):
                try:
                    client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            dedup = Dedup(client, Keys("crawl"), run_id="bench-run")
            before = _used_memory(client)
            _fill(dedup, count)
            after = _used_memory(client)
            client.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    return (after - before) / count


def _fill(dedup: Dedup, count: int) -> None:
    for start in range(0, count, BATCH):
        fps = [
            fingerprint(f"https://site-{n % 997}.example/section/{n // 997}/page-{n}.html")
            for n in range(start, min(start + BATCH, count))
        ]
        claim = dedup.claim(fps)
        dedup.confirm([fp for fp, new in zip(fps, claim.is_new, strict=True) if new])


def cluster_dedup_bytes_per_url(count: int, cluster_url: str) -> float:
    """The same figure on a Redis Cluster: used_memory summed over its primaries."""
    from redis.cluster import RedisCluster

    from shared.redis.client import OPERATOR, connect_redis
    from shared.settings import Settings

    prefix = f"bench{secrets.token_hex(4)}"
    client = connect_redis(Settings(redis_url=cluster_url, redis_prefix=prefix), OPERATOR)
    assert isinstance(client, RedisCluster)

    def used() -> int:
        # Less the output buffers of the replicas: a burst of writes still on its way to a
        # replica is not state, and it drains within moments.
        time.sleep(1.0)
        per_node = client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return sum(int(info["used_memory"]) - int(info["mem_clients_slaves"]) for info in per_node.values())

    try:
        dedup = Dedup(client, Keys(prefix), run_id="bench-run")
        before = used()
        _fill(dedup, count)
        after = used()
    finally:
        keys = list(client.scan_iter(f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
        client.close()
    return (after - before) / count


if __name__ == "__main__":
    urls = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    if len(sys.argv) > 2:
        print(f"cluster {sys.argv[2]}: {cluster_dedup_bytes_per_url(urls, sys.argv[2]):.1f} B/URL")
    else:
        print(f"standalone: {dedup_bytes_per_url(urls):.1f} B/URL")
