"""RabbitMQ, Redis and PostgreSQL of the soak's own, on loopback ports of their own with their own
data directories, which the nemesis may stop and start as often as its schedule says: the
services on the standard ports, which other test runs use, are never touched.

RabbitMQ and Redis come from deploy/local/deep.sh (a node and a Redis beside any other), with
its ports and folder set for the soak; PostgreSQL is a cluster made with initdb in the soak's
folder and run with pg_ctl, as the postgres user when the soak runs as root (PostgreSQL refuses
to run as root).

    ports = Ports(27100)            # every port the soak uses is base + a fixed offset
    services = OwnServices(ports, Path("/var/tmp/crawl-soak-27100"))
    services.start()
    services.outage("redis", 5.0)   # down for 5 s, then up again and answering
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pika
import psycopg
import redis

REPO = Path(__file__).resolve().parents[2]
DEEP_SH = REPO / "deploy" / "local" / "deep.sh"
BACK_UP_WAIT_S = 180.0


@dataclass(frozen=True)
class Ports:
    """Every port of one soak, from one base: several soaks with other bases run side by side."""

    base: int

    @property
    def postgres(self) -> int:
        return self.base + 1

    @property
    def redis(self) -> int:
        return self.base + 2

    @property
    def amqp(self) -> int:
        return self.base + 3

    @property
    def amqp_dist(self) -> int:
        return self.base + 4

    @property
    def management(self) -> int:
        return self.base + 5

    def proxied(self, service: str) -> int:
        """The port of the fault proxy in front of `service` (postgres, redis, amqp)."""
        return {"postgres": self.base + 11, "redis": self.base + 12, "amqp": self.base + 13}[service]

    @property
    def dashboard(self) -> int:
        return self.base + 20

    def service(self, service: str) -> int:
        return {"postgres": self.postgres, "redis": self.redis, "amqp": self.amqp}[service]


def _run(command: list[str], env: dict[str, str] | None = None, timeout: float = 180) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}"
        )
    return done.stdout


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("no /usr/lib/postgresql/*/bin/pg_ctl: install the postgresql package")
    return Path(found[-1]).parent


class OwnServices:
    def __init__(self, ports: Ports, folder: Path) -> None:
        self.ports = ports
        self.folder = folder
        self.node = f"soak{ports.base}@localhost"
        self._pg_bin = _postgres_bin()
        self._pg_data = folder / "postgres"

    # ---- what the pipeline's settings point at (the proxies sit in front of these) ----------

    def direct_env(self) -> dict[str, str]:
        """Settings that reach the services themselves, not through the proxies."""
        return {
            "AMQP_URL": f"amqp://guest:guest@127.0.0.1:{self.ports.amqp}/%2f",
            "REDIS_URL": f"redis://127.0.0.1:{self.ports.redis}/0",
            "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{self.ports.postgres}/crawler",
            "RABBITMQ_MANAGEMENT_URL": f"http://127.0.0.1:{self.ports.management}",
        }

    def _deep_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DEEP_DIR": str(self.folder / "broker"),
            "DEEP_NODE": self.node,
            "DEEP_AMQP_PORT": str(self.ports.amqp),
            "DEEP_DIST_PORT": str(self.ports.amqp_dist),
            "DEEP_MGMT_PORT": str(self.ports.management),
            "DEEP_REDIS_PORT": str(self.ports.redis),
        }

    def _rabbit_env(self) -> dict[str, str]:
        broker = self.folder / "broker"
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_MNESIA_BASE": str(broker / "mnesia"),
            "RABBITMQ_LOG_BASE": str(broker / "log"),
            "RABBITMQ_CONFIG_FILE": str(broker / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(broker / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(broker / "rabbitmq.pid"),
        }

    # ---- the whole set ----------------------------------------------------------------------

    def start(self) -> None:
        """Start all three, empty (a folder left by an earlier soak on these ports is removed)."""
        self.stop()
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        _run([str(DEEP_SH), "up"], env=self._deep_env())
        self._initdb()
        self._postgres_start()
        self.wait_up()
        self._create_database()

    def stop(self) -> None:
        """Stop whatever of the three runs on these ports; never another node or cluster."""
        broker = self.folder / "broker"
        if (broker / "rabbitmq.pid").exists() or (broker / "redis.pid").exists():
            # (rabbitmqctl stop waits for a pid file that a node never started leaves absent)
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _run([str(DEEP_SH), "down"], env=self._deep_env(), timeout=120)
        if (self._pg_data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _run(
                    _as_postgres(
                        [str(self._pg_bin / "pg_ctl"), "-D", str(self._pg_data), "-m", "fast", "stop"]
                    )
                )

    def wait_up(self) -> None:
        for service in ("amqp", "redis", "postgres"):
            self.wait_service(service)

    def wait_service(self, service: str) -> None:
        checks: dict[str, Callable[[], None]] = {
            "amqp": self._amqp_answers,
            "redis": self._redis_answers,
            "postgres": self._postgres_answers,
        }
        deadline = time.monotonic() + BACK_UP_WAIT_S
        while True:
            try:
                checks[service]()
                return
            except Exception as exc:  # any failure to answer: not up yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the soak's {service} did not come up: {exc}") from None
                time.sleep(0.25)

    # ---- outages ----------------------------------------------------------------------------

    def outage(self, service: str, down_s: float) -> None:
        """`service` (amqp, redis, postgres) down for `down_s`, then started and answering."""
        {"amqp": self._rabbit_stop, "redis": self._redis_stop, "postgres": self._postgres_stop}[service]()
        try:
            time.sleep(down_s)
        finally:
            {"amqp": self._rabbit_start, "redis": self._redis_start, "postgres": self._postgres_start}[
                service
            ]()
            self.wait_service(service)

    def _rabbit_stop(self) -> None:
        # The application stopped: connections closed, listener gone, queues and messages kept.
        _run(["rabbitmqctl", "-n", self.node, "stop_app"], env=self._rabbit_env())

    def _rabbit_start(self) -> None:
        _run(["rabbitmqctl", "-n", self.node, "start_app"], env=self._rabbit_env())
        _run(["rabbitmqctl", "-n", self.node, "await_startup"], env=self._rabbit_env())

    def _redis_stop(self) -> None:
        # Without saving: it comes back empty, as after a crash of a Redis without persistence.
        _run(["redis-cli", "-p", str(self.ports.redis), "shutdown", "nosave"])

    def _redis_start(self) -> None:
        _run([str(DEEP_SH), "redis-up"], env=self._deep_env())

    def _initdb(self) -> None:
        self._pg_data.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self._pg_data, "postgres", "postgres")
        _run(
            _as_postgres(
                [str(self._pg_bin / "initdb"), "-D", str(self._pg_data), "-A", "trust", "-U", "postgres"]
            )
        )

    def _postgres_start(self) -> None:
        options = (
            f"-p {self.ports.postgres} -k {self._pg_data} -c listen_addresses=127.0.0.1"
            " -c max_connections=300 -c fsync=off -c full_page_writes=off"
        )
        log = self._pg_data / "server.log"
        _run(
            _as_postgres(
                [
                    str(self._pg_bin / "pg_ctl"),
                    "-D",
                    str(self._pg_data),
                    "-o",
                    options,
                    "-l",
                    str(log),
                    "-w",
                    "start",
                ]
            )
        )

    def _postgres_stop(self) -> None:
        # Immediate: no checkpoint, the next start replays the WAL, as after a crash.
        _run(
            _as_postgres([str(self._pg_bin / "pg_ctl"), "-D", str(self._pg_data), "-m", "immediate", "stop"])
        )

    def _create_database(self) -> None:
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.ports.postgres}/postgres", autocommit=True
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'crawler'").fetchone():
                conn.execute("CREATE DATABASE crawler")

    # ---- answering ----------------------------------------------------------------------------

    def _amqp_answers(self) -> None:
        pika.BlockingConnection(
            pika.URLParameters(self.direct_env()["AMQP_URL"] + "?connection_attempts=1")
        ).close()

    def _redis_answers(self) -> None:
        client = redis.Redis(port=self.ports.redis, socket_connect_timeout=1)
        try:
            client.ping()
        finally:
            client.close()

    def _postgres_answers(self) -> None:
        url = f"postgresql://postgres@127.0.0.1:{self.ports.postgres}/postgres"
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
