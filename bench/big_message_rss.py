"""Peak memory of a worker and a dead-letter consumer that each handle one huge message.

    python -m bench.big_message_rss [--mb 50] [--body bytes|json]

Starts one worker and one dead-letter consumer under names of their own, publishes one message
of the given size to the bulk queue (bytes: not even UTF-8; json: a task whose URL is the whole
size, which a parser reads to the end), waits for its dead-letter row and
prints each process's peak RSS (VmHWM), idle and after the message, and the size of the body
the row keeps. Everything made under the names is removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from ops.crawl import Processes
from ops.teardown import remove_pipeline
from shared.amqp import broker
from shared.amqp.topology import build_topology, new_task_routing_key, work_exchange
from shared.postgres import db
from shared.settings import Settings

SETTLE_S = 120.0


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50, help="size of the message in MB (default 50)")
    parser.add_argument("--body", choices=("bytes", "json"), default="bytes", help="what the message holds")
    args = parser.parse_args()
    name = f"rss{os.getpid()}"
    database_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/crawler_test")
    settings = Settings(crawl_namespace=name, redis_prefix=name, pg_schema=name, database_url=database_url)
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "DATABASE_URL": database_url,
    }
    connection = broker.connect(settings, "rss-publisher")
    broker.declare_topology(connection, build_topology(settings))
    db.ensure_schema(settings)
    with tempfile.TemporaryDirectory() as logs:
        procs = Processes(Path(logs), env)
        try:
            worker = procs.start("worker", "worker")
            dlq = procs.start("dlq_consumer", "dlq_consumer")
            time.sleep(4)  # both connected and idle
            idle = peak_rss_mib(worker.pid), peak_rss_mib(dlq.pid)
            size = args.mb * 1_000_000
            if args.body == "bytes":
                body = b"\xff" * size
            else:
                body = b'{"url":"http://127.0.0.1:9/' + b"x" * (size - 64) + b'","run_id":"r","queue":"bulk"}'

            channel = broker.confirm_channel(connection)
            broker.publish(
                channel, broker.Publication(work_exchange(name), new_task_routing_key("bulk"), body)
            )
            del body
            connection.close()  # idle from here on: the broker would drop it for missed heartbeats
            deadline = time.monotonic() + SETTLE_S
            stored = None
            while stored is None and time.monotonic() < deadline:
                procs.check_alive()
                with db.connect(settings, autocommit=True) as conn:
                    stored = conn.execute("SELECT reason, length(body) FROM dead_letters").fetchone()
                time.sleep(0.5)
            after = peak_rss_mib(worker.pid), peak_rss_mib(dlq.pid)
            took_s = time.monotonic() - deadline + SETTLE_S
        finally:
            procs.stop_all()
            if connection.is_open:
                connection.close()
            remove_pipeline(settings)
    print(
        f"{args.mb} MB message ({args.body}); dead letter (reason, body bytes) {stored} after {took_s:.0f} s"
    )
    print(f"worker        peak RSS idle {idle[0]:6.1f} MiB, after the message {after[0]:6.1f} MiB")
    print(f"dlq_consumer  peak RSS idle {idle[1]:6.1f} MiB, after the message {after[1]:6.1f} MiB")
    return 0 if stored is not None else 1


if __name__ == "__main__":
    sys.exit(main())
