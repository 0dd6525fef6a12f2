"""QUEUE_TYPE=quorum on the three-node cluster: every replicated queue has a copy on each node."""

from __future__ import annotations

import pytest

from shared.amqp import broker
from shared.amqp.topology import build_topology, work_queue
from shared.settings import Settings
from tests.faults_cluster.cluster import NODES, node_name, queue_copies

pytestmark = pytest.mark.timeout(120)


def test_quorum_queues_have_a_member_on_every_node(settings: Settings) -> None:
    connection = broker.connect(settings, "cluster-spread")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()

    copies = queue_copies()
    ours = {name: c for name, c in copies.items() if name.startswith(settings.crawl_namespace + ".")}
    ns = settings.crawl_namespace
    assert ours[work_queue(ns, "priority")].type == "classic"  # priorities need a classic queue
    quorum = {name: c for name, c in ours.items() if c.type == "quorum"}
    assert {work_queue(ns, "ttl"), work_queue(ns, "bulk")} <= set(quorum)
    assert len(quorum) == len(ours) - 1, {n: c.type for n, c in ours.items()}
    everyone = tuple(sorted(node_name(n) for n in NODES))
    for name, each in quorum.items():
        assert each.members == everyone, name
        assert each.leader in everyone, name
