"""remove_pipeline against the real broker and Redis: what a pipeline made under its names goes,
the runs' hold queues included, which are not part of the topology."""

from __future__ import annotations

import pika.exceptions

from ops import management
from ops.runs import pause
from ops.teardown import remove_pipeline
from shared.amqp import broker
from shared.amqp.topology import build_topology, work_queue
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.redis.runstate import held_queue
from shared.settings import Settings


def exists(settings: Settings, queue: str) -> bool:
    connection = broker.connect(settings, "test")
    try:
        connection.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    finally:
        if connection.is_open:
            connection.close()
    return True


def test_the_topology_keys_and_a_paused_runs_hold_queue_are_removed(settings: Settings) -> None:
    connection = broker.connect(settings, "test")
    broker.declare_topology(connection, build_topology(settings))
    connection.close()
    keys = Keys(settings.redis_prefix)
    client = connect_redis(settings, OPERATOR)
    client.hset(keys.run_stats("r1"), "enqueued.bulk", 1)
    pause(settings, client, keys, "r1")
    hold = held_queue(settings.crawl_namespace, "r1")
    assert exists(settings, hold)

    remove_pipeline(settings)

    assert not exists(settings, hold)
    assert not exists(settings, work_queue(settings.crawl_namespace, "bulk"))
    assert list(client.scan_iter(keys.all_pattern())) == []
    client.close()


def test_a_hold_queue_redis_no_longer_knows_of_is_found_through_the_management_api(
    settings: Settings, management_api: management.HttpGet
) -> None:
    hold = held_queue(settings.crawl_namespace, "forgotten")
    connection = broker.connect(settings, "test")
    connection.channel().queue_declare(hold, durable=True)
    connection.close()

    remove_pipeline(settings)

    assert not exists(settings, hold)
