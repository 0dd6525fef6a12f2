"""The local three-node RabbitMQ cluster of deploy/local/rabbitmq-cluster.sh, as the cluster
scenarios drive it: which node leads a queue, which nodes hold it, stopping and starting nodes."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions

from shared.settings import amqp_urls

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "rabbitmq-cluster.sh"
NODES = (1, 2, 3)


def node_name(n: int) -> str:
    return f"crawl{n}@localhost"


def node_number(name: str) -> int:
    return int(name.split("@")[0].removeprefix("crawl"))


def cluster_url() -> str:
    """AMQP_URL naming the three nodes; empty when the cluster is not up (`make faults-cluster`
    sets CLUSTER_AMQP_URL; by hand: `make rabbitmq-cluster-up`, then the URL it prints)."""
    url = os.environ.get("CLUSTER_AMQP_URL", "")
    if not url:
        return ""
    for each in amqp_urls(url):
        try:
            pika.BlockingConnection(pika.URLParameters(each)).close()
        except pika.exceptions.AMQPError:
            return ""
    return url


def script(*args: str, timeout_s: float = 120) -> str:
    done = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"{SCRIPT.name} {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


@dataclass(frozen=True)
class QueueCopies:
    name: str
    type: str
    leader: str
    members: tuple[str, ...]


def queue_copies(asking: int = 1) -> dict[str, QueueCopies]:
    """Every queue of the cluster's default vhost, as node `asking` (which must be up) sees it."""
    columns = ("name", "type", "leader", "members")
    out = script("ctl", str(asking), "list_queues", *columns, "--formatter", "json")
    found: dict[str, QueueCopies] = {}
    for row in json.loads(out):
        members = row.get("members") or []
        found[row["name"]] = QueueCopies(
            row["name"], str(row["type"]), str(row.get("leader") or ""), tuple(sorted(map(str, members)))
        )
    return found


def stop_node(n: int) -> None:
    script("stop-node", str(n))


def start_node(n: int) -> None:
    script("start-node", str(n))
