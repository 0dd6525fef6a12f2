"""connect_redis builds every client from one place, with the waits of its use."""

from __future__ import annotations

import pytest

from shared.errors import ServiceUnavailable
from shared.redis.client import GLANCE, OPERATOR, PRODUCER, WORKER, RedisUse, connect_redis
from shared.redis.deferred_writes import DeferringRedis
from shared.settings import Settings

SETTINGS = Settings(redis_url="redis://127.0.0.1:6379/3")


@pytest.mark.parametrize("use", [PRODUCER, WORKER, GLANCE, OPERATOR], ids=lambda use: use.name)
def test_a_client_waits_as_its_use_says(use: RedisUse) -> None:
    client = connect_redis(SETTINGS, use)  # connects lazily: nothing is sent here
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
            use.command_timeout_s,
            use.connect_timeout_s,
        )
        assert kwargs["health_check_interval"] == use.idle_check_s
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("127.0.0.1", 6379, 3)
    finally:
        client.close()


def test_the_worker_passes_its_own_client_class() -> None:
    client = connect_redis(SETTINGS, WORKER, client_class=DeferringRedis)
    try:
        assert isinstance(client, DeferringRedis)
    finally:
        client.close()


def test_a_ping_that_finds_no_redis_is_one_line_service_unavailable() -> None:
    unreachable = Settings(redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ServiceUnavailable) as caught:
        connect_redis(unreachable, GLANCE, ping=True)
    assert "127.0.0.1:1" in str(caught.value) and "\n" not in str(caught.value)
