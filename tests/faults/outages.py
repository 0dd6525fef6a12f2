"""Stopping and restarting the local RabbitMQ, Redis and PostgreSQL, always restarted afterwards.

These services are shared with every other test run on the machine. Before taking one down we
wait until no other test run, and no benchmark connected to them, is running (a restart would
break its connections). Whatever happens inside the block, the service is started again and
checked to be up before the block is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import redis

from shared.settings import Settings

TEST_RUN = re.compile(r"pytest")
BENCHMARK = re.compile(r"bench")
SERVICE_PORTS = frozenset({5672, 6379, 5432})
EXCLUSIVE_WAIT_S = 600.0
BACK_UP_WAIT_S = 90.0
REDIS_START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
    "--logfile", "/var/log/redis/ci.log",
]  # fmt: skip


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _service_sockets() -> set[str]:
    """Inodes of the TCP sockets connected to a service port on this machine."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) in SERVICE_PORTS:
                    inodes.add(fields[9])
    return inodes


def _holds_a_service_connection(pid: int, sockets: set[str]) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in sockets:
                    return True
    return False


def other_test_runs() -> list[str]:
    """Command lines of other test runs, and of benchmarks connected to RabbitMQ, Redis or
    PostgreSQL (a benchmark that only serves pages is left alone): neither this process, nor one
    of its ancestors (the shell that started it), nor one of its children."""
    parents = _parents()
    family = {os.getpid()}
    pid = os.getpid()
    while pid in parents and parents[pid] > 1:
        pid = parents[pid]
        family.add(pid)

    def descends_from_us(pid: int) -> bool:
        while pid in parents and pid > 1:
            if pid == os.getpid():
                return True
            pid = parents[pid]
        return False

    sockets = _service_sockets()
    found = []
    for pid in parents:
        if pid in family or descends_from_us(pid):
            continue
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if TEST_RUN.search(command) or (
                BENCHMARK.search(command) and _holds_a_service_connection(pid, sockets)
            ):
                found.append(f"{pid} {command.strip()[:160]}")
    return found


def wait_until_alone() -> None:
    deadline = time.monotonic() + EXCLUSIVE_WAIT_S
    while others := other_test_runs():
        if time.monotonic() > deadline:
            raise AssertionError(f"other test runs still use the services: {others}")
        time.sleep(2)


def _run(*command: str) -> None:
    subprocess.run(command, check=False, capture_output=True, timeout=120)


def _wait_until(check_up: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + BACK_UP_WAIT_S
    while True:
        try:
            check_up()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not come back: {exc}") from None
            time.sleep(0.25)


def rabbitmq_is_up(settings: Settings) -> None:
    pika.BlockingConnection(pika.URLParameters(settings.amqp_url)).close()


@contextlib.contextmanager
def rabbitmq_stopped(settings: Settings) -> Iterator[None]:
    """RabbitMQ's application stopped (connections closed, listener gone) inside the block."""
    wait_until_alone()
    _run("rabbitmqctl", "stop_app")
    try:
        yield
    finally:
        _run("rabbitmqctl", "start_app")
        _run("rabbitmqctl", "await_startup")
        _wait_until(lambda: rabbitmq_is_up(settings), "RabbitMQ")


def redis_is_up(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=1)
    try:
        client.ping()
    finally:
        client.close()


@contextlib.contextmanager
def redis_stopped(settings: Settings) -> Iterator[None]:
    """Redis shut down without saving inside the block; it comes back empty, as after a crash."""
    wait_until_alone()
    _run("redis-cli", "-p", "6379", "shutdown", "nosave")
    try:
        yield
    finally:
        Path("/var/lib/redis").mkdir(parents=True, exist_ok=True)
        Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
        _run(*REDIS_START)
        _wait_until(lambda: redis_is_up(settings), "Redis")


def _postgres_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action)


def postgres_is_up() -> None:
    done = subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432"], check=False, capture_output=True)
    assert done.returncode == 0, done.stdout


@contextlib.contextmanager
def postgres_stopped() -> Iterator[None]:
    wait_until_alone()
    _postgres_cluster("stop")
    try:
        yield
    finally:
        _postgres_cluster("start")
        _wait_until(postgres_is_up, "PostgreSQL")
