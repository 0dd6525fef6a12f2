"""What the dashboard costs with run pages open: its CPU (percent of one core) and its
sampler's sample count, with 5 live run pages (5 SSE clients) for a while, and the p95 of the
run page and the runs list over HTTP.

`python -m bench.dashboard_cost [--pages 20000] [--dead 2000] [--clients 5] [--seconds 30]`
builds a run in a PostgreSQL schema (and namespace, Redis prefix) of its own with
bench.run_page_cost's builder (plain SQL through the writers' triggers), serves
`python -m ops.dashboard` as a process of its own on a free port, holds CLIENTS streams of
/events/runs/<run> open for SECONDS, and prints one JSON line: the dashboard's CPU over that
time, the samples its sampler took (one per interval for all the clients together, not one each),
and the latencies. Everything it made is removed at the end.

It does not crawl: the pipeline's pages/s beside open pages is `make bench` with this running
against its namespace, which needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import httpx2 as httpx

from bench.measure import proc_cpu_s
from bench.run_page_cost import RUN, build, p95_ms
from ops.teardown import remove_pipeline
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def hold_stream(url: str, stop: threading.Event, received: list[int]) -> None:
    with httpx.stream("GET", url, timeout=60) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                received.append(1)
            if stop.is_set():
                return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard_cost", description=__doc__)
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--dead", type=int, default=2_000)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--refresh", type=float, default=2.0, help="DASHBOARD_REFRESH_S")
    args = parser.parse_args(argv)
    name = f"benchdash{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env({"CRAWL_NAMESPACE": name, "PG_SCHEMA": name, "REDIS_PREFIX": name})
    db.ensure_schema(settings)
    port = free_port()
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "PG_SCHEMA": name,
        "REDIS_PREFIX": name,
        "DASHBOARD_PORT": str(port),
        "DASHBOARD_REFRESH_S": str(args.refresh),
        "DASHBOARD_TOKEN": "",
    }
    dashboard = None
    try:
        with db.connect(settings, autocommit=True) as conn:
            build(conn, args.pages, args.dead, 0)
        client = connect_redis(settings, OPERATOR)
        client.hset(Keys(name).run_stats(RUN), mapping={"enqueued.bulk": args.pages + args.dead})
        client.close()
        dashboard = subprocess.Popen(
            [sys.executable, "-m", "ops.dashboard"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and dashboard.poll() is None, "the dashboard did not start"
            time.sleep(0.2)
        html = {"Accept": "text/html"}
        figures: dict[str, Any] = {
            "pages": args.pages,
            "dead_letters": args.dead,
            "clients": args.clients,
            "seconds": args.seconds,
            "refresh_s": args.refresh,
            "run_page_p95_ms": p95_ms(lambda: httpx.get(f"{base}/runs/{RUN}", headers=html, timeout=30), 20),
            "runs_list_p95_ms": p95_ms(lambda: httpx.get(f"{base}/", headers=html, timeout=30), 20),
            "run_api_p95_ms": p95_ms(lambda: httpx.get(f"{base}/api/v1/runs/{RUN}", timeout=30), 20),
        }
        idle_before = proc_cpu_s(dashboard.pid)
        time.sleep(min(5.0, args.seconds / 3))
        figures["idle_cpu_percent"] = round(
            100 * (proc_cpu_s(dashboard.pid) - idle_before) / min(5.0, args.seconds / 3), 1
        )
        stop = threading.Event()
        received: list[int] = []
        streams = [
            threading.Thread(
                target=hold_stream, args=(f"{base}/events/runs/{RUN}", stop, received), daemon=True
            )
            for _ in range(args.clients)
        ]
        for stream in streams:
            stream.start()
        time.sleep(1.0)  # connected, first sample sent
        cpu_before, started = proc_cpu_s(dashboard.pid), time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        cpu = proc_cpu_s(dashboard.pid) - cpu_before
        samplers = httpx.get(f"{base}/api/v1/config", timeout=10).json()["samplers"]
        stop.set()
        run_scope = next(v for k, v in samplers.items() if k.startswith(f"run:{RUN}"))
        figures.update(
            {
                "cpu_percent_of_a_core": round(100 * cpu / elapsed, 1),
                "samples": run_scope["samples"],
                "subscribers": run_scope["subscribers"],
                "interval_s_now": run_scope["interval_s"],
                "messages_received": len(received),
                "samples_per_interval_per_client": round(
                    run_scope["samples"] / max(1, len(received) / args.clients), 2
                ),
            }
        )
        print(json.dumps(figures))
        return 0
    finally:
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(timeout=10)
        remove_pipeline(settings)


if __name__ == "__main__":
    sys.exit(main())
