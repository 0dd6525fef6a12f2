"""The run page's panels against the real services: proxy health and slowed domains from the
keys the workers keep, the render figures from the run's counters, its render dead letters and
the render queue, and a discovery run's total marked as still growing while links wait."""

from __future__ import annotations

import dataclasses

import pika
import pytest

from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord
from ops.dashboard import data
from ops.dashboard.config import DashboardSettings
from ops.dashboard.connections import Connections
from ops.dashboard.regions import Views
from shared.amqp import broker
from shared.amqp.topology import build_topology, discovery_queue, render_queue
from shared.http.proxies import RedisBench
from shared.messages import CrawlTask
from shared.postgres import db
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from worker.politeness.ratelimit import RateLimiter

pytestmark = pytest.mark.integration

RUN = "panels-run"


def publish(settings: Settings, queue: str, count: int) -> None:
    connection = broker.connect(settings, "panels-test")
    try:
        channel = connection.channel()
        for n in range(count):
            channel.basic_publish("", queue, f"m{n}".encode(), pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def test_the_run_page_shows_proxies_slowed_domains_renders_and_a_growing_total(settings: Settings) -> None:
    shown = dataclasses.replace(
        settings, proxies="http://127.0.0.1:3128,http://127.0.0.1:3129", rate_limit_rps=4.0, rate_jitter=0.3
    )
    db.ensure_schema(shown)
    connection = broker.connect(shown, "panels-test")
    broker.declare_topology(connection, build_topology(shown))
    connection.close()
    client = connect_redis(shown, OPERATOR)
    keys = Keys(shown.redis_prefix)
    bench = RedisBench(client, keys, max_failures=1, bench_s=60)
    bench.failed("http://127.0.0.1:3129")  # benched: failing
    RateLimiter(client, keys, recovery_s=600).slow_down("slow.example", 4.0, why="429")
    client.hset(
        keys.run_stats(RUN),
        mapping={
            "enqueued.bulk": 5,
            "enqueued.render": 4,
            "renders.ok": 3,
            "renders.render_timeout": 2,
            "render_ms": 5000,
            "sent_to_render.script_shell": 1,
        },
    )
    client.set(keys.run_discovery(RUN), "{}")  # a discovery run (producer/frontier_redis.py)
    client.close()
    with db.connect(shown) as conn:
        body = CrawlTask(url="https://a.example/slow", run_id=RUN, queue="render").encode()
        store.upsert(
            conn,
            DeadLetterRecord(
                RUN,
                "https://a.example/slow",
                "render_timeout",
                "deadline",
                None,
                3,
                0,
                render_queue(shown.crawl_namespace),
                "r1",
                body,
                None,
                None,
                len(body),
            ),
        )
        conn.commit()
    publish(shown, render_queue(shown.crawl_namespace), 2)
    publish(shown, discovery_queue(shown.crawl_namespace), 1)
    links = Connections(shown)
    views = Views(shown, DashboardSettings(), links=links)
    try:
        run = data.run_detail(links, RUN, views.get)
        assert run["discovery"] and run["growing"]
        assert run["proxies"]["usable"] == 1 and run["proxies"]["total"] == 2
        assert [(p["proxy"], p["state"]) for p in run["proxies"]["rows"]] == [
            ("http://127.0.0.1:3128", "ok"),
            ("http://127.0.0.1:3129", "failing"),
        ]
        assert run["politeness"]["jitter"] == 0.3 and run["politeness"]["slowed_total"] == 1
        assert run["politeness"]["slowed"][0]["domain"] == "slow.example"
        render = run["render"]
        assert (render["done"], render["failed"], render["timeouts"], render["mean_ms"]) == (3, 2, 2, 1000)
        assert render["dead"] == {"render_timeout": 1}
        assert render["sent"] == {"routing rule": 4, "auto: script_shell": 1}
        # The render queue is there; its figures are the management API's, refreshed every 5 s
        # (none or 0 for a queue it has not sampled yet), or live ones from passive declares.
        assert render["queue"] == render_queue(shown.crawl_namespace) and render["depth"] is not None
        assert render["depth"]["ready"] in (None, 0, 2)
        html = views.regions(
            "run", {**views.context("run", RUN), "can_act": False, "csrf": "", "operations": []}
        )
        assert "total still growing" in html["run_progress"]
        assert 'id="proxies-usable">1</b> of 2 ok' in html["run_politeness"]
        assert (
            "slow.example" in html["run_politeness"] and 'id="rate-jitter">+30%</b>' in html["run_politeness"]
        )
        assert (
            'id="render-done">3</b>' in html["run_render"]
            and 'id="render-timeouts">2</b>' in html["run_render"]
        )
    finally:
        links.close()
