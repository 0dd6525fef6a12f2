"""How fast pika alone publishes persistent messages on this machine, today.

The producer's goal is an absolute rate, and this machine's speed is not constant (on a slow
day everything runs at half speed). This is the yardstick printed beside it: the same broker,
a durable queue declared as ours are, messages of the size of a task, one pika channel
publishing as fast as it can with no confirms, no sitemap parsing and no dedup. The clock
stops when the broker answers a declare sent after the last message, which it handles only
once it has routed every message before it on the channel.
"""

from __future__ import annotations

import time

import pika

from shared.amqp import broker
from shared.amqp.topology import CLASSIC_QUEUE_ARGUMENTS
from shared.settings import Settings

MESSAGES = 100_000
BODY = b'{"url":"http://127.0.1.1:8531/p/12345.html","run_id":"bench","queue":"bulk"}'.ljust(160)


def raw_publish_rate(settings: Settings, messages: int = MESSAGES) -> float:
    """Persistent messages per second, published and routed."""
    connection = broker.connect(settings, "bench-raw-publish")
    queue = f"{settings.crawl_namespace}.raw-publish"
    channel = connection.channel()
    try:
        channel.queue_declare(queue, durable=True, arguments=CLASSIC_QUEUE_ARGUMENTS)
        persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        started = time.monotonic()
        for _ in range(messages):
            channel.basic_publish("", queue, BODY, persistent)
        routed = channel.queue_declare(queue, passive=True).method.message_count
        elapsed = time.monotonic() - started
        if routed != messages:
            raise RuntimeError(f"the broker holds {routed} of {messages} messages published")
        return messages / elapsed
    finally:
        channel.queue_delete(queue)
        connection.close()
