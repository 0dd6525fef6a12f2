"""ops.management.published_into: the broker's own count of messages routed into queues."""

from __future__ import annotations

from typing import Any

import requests

from ops.management import published_into
from shared.settings import Settings


def test_the_queues_publish_totals_are_added_up_and_a_queue_with_none_yet_counts_0() -> None:
    answers: dict[str, Any] = {
        "ns.bulk": {"name": "ns.bulk", "message_stats": {"publish": 70, "publish_details": {"rate": 0}}},
        "ns.priority": {"name": "ns.priority", "message_stats": {"publish": 5}},
        "ns.ttl": {"name": "ns.ttl"},  # no message_stats until something was published
    }
    asked: list[str] = []

    def get(url: str) -> Any:
        asked.append(url)
        return answers[url.rsplit("/", 1)[1]]

    settings = Settings.from_env({})
    assert published_into(settings, get, ["ns.bulk", "ns.priority", "ns.ttl"]) == 75
    assert asked[0] == "http://127.0.0.1:15672/api/queues/%2F/ns.bulk"


def test_an_api_that_does_not_answer_gives_none() -> None:
    def get(url: str) -> Any:
        raise requests.ConnectionError("refused")

    assert published_into(Settings.from_env({}), get, ["ns.bulk"]) is None
