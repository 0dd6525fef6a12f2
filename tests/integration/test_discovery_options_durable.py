"""A discovery run's options outlive a Redis restart: the producer keeps them in PostgreSQL as
well (producer/discovery_store.py), and a frontier that finds none in Redis, as after Redis came
back empty, reads them there and puts them back. Without that copy the frontier took the run for
one that does not discover and cut every link as out of scope: the soak (tests/soak/) saw 28 of a
discovery run's 400 pages never enqueued after a Redis outage and a frontier restart."""

from __future__ import annotations

import functools

from producer.discovery_scope import DiscoveryOptions
from producer.discovery_store import store_options, stored_options
from producer.frontier import Frontier
from producer.frontier_redis import RedisFrontierState, keep_options
from producer.pipeline_types import Counts
from producer.sitemap_types import SitemapEntry
from shared.links_message import PageLinks
from shared.postgres import db
from shared.redis.client import PRODUCER, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings

ROOT = "http://127.0.0.1:8431/p/0"
OPTIONS = DiscoveryOptions(start_urls=(ROOT,), max_depth=9, max_pages=0, roots=(ROOT,))


def test_a_frontier_finds_a_runs_options_after_redis_lost_them_and_follows_its_links(
    settings: Settings,
) -> None:
    db.ensure_schema(settings)
    client = connect_redis(settings, PRODUCER, ping=True)
    keys = Keys(settings.redis_prefix)
    try:
        store_options(settings, "discover", OPTIONS)  # as the producer does when it seeds the run
        keep_options(client, keys, "discover", OPTIONS)
        client.delete(keys.run_discovery("discover"))  # Redis restarted empty

        enqueued: list[str] = []

        def enqueue(run_id: str, depth: int, entries: list[SitemapEntry]) -> Counts:
            enqueued.extend(entry.url for entry in entries)
            return Counts(enqueued={"bulk": len(entries)})

        state = RedisFrontierState(client, keys, functools.partial(stored_options, settings))
        links = ("http://127.0.0.1:8431/p/1", "http://127.0.0.1:8431/p/2")
        outcome = Frontier(state, enqueue).take([PageLinks("discover", 1, ROOT, links)])
        assert (outcome.enqueued, dict(+outcome.cut)) == (2, {})
        assert enqueued == list(links)
        assert client.get(keys.run_discovery("discover")) == OPTIONS.encode(), (
            "put back for the next frontier"
        )
        # Without the durable copy the same run's options are unknown.
        client.delete(keys.run_discovery("discover"))
        cut = Frontier(RedisFrontierState(client, keys), enqueue).take(
            [PageLinks("discover", 1, ROOT, links)]
        )
        assert (cut.enqueued, dict(+cut.cut)) == (0, {"out_of_scope": 2})
    finally:
        client.delete(keys.run_discovery("discover"))
        client.close()


def test_a_run_that_does_not_discover_has_no_stored_options(settings: Settings) -> None:
    db.ensure_schema(settings)
    assert stored_options(settings, "sitemap-only") is None
