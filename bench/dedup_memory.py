"""Bytes per URL of the producer's dedup state, measured in a private Redis with INFO memory.

A private redis-server (unix socket, no persistence, default encodings) keeps other Redis users
out of the figure. URLs go through the producer's own claim and confirm scripts, in batches,
exactly as a crawl would store them.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import redis

from producer.dedup import Dedup
from shared.keys import Keys
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
            for start in range(0, count, BATCH):
                fps = [
                    fingerprint(f"https://site-{n % 997}.example/section/{n // 997}/page-{n}.html")
                    for n in range(start, min(start + BATCH, count))
                ]
                claim = dedup.claim(fps)
                dedup.confirm([fp for fp, new in zip(fps, claim.is_new, strict=True) if new])
            after = _used_memory(client)
            client.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    return (after - before) / count
