"""DeferringRedis against the real Redis: held writes ride along with the thread's next command."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from shared.redis_client import OPERATOR, WORKER, connect_redis
from shared.settings import Settings
from worker.deferred_writes import DeferringRedis, flush, write_later

pytestmark = pytest.mark.integration


@pytest.fixture
def client(settings: Settings) -> Iterator[DeferringRedis]:
    made = connect_redis(settings, WORKER, client_class=DeferringRedis)
    assert isinstance(made, DeferringRedis)  # connect_redis is annotated as making a plain Redis
    yield made
    made.close()


@pytest.fixture
def key(settings: Settings) -> str:
    return f"{settings.redis_prefix}:deferred"


def test_a_held_write_is_sent_with_the_next_command_and_before_it(client: DeferringRedis, key: str) -> None:
    client.defer("SET", key, b"held")
    with redis.Redis(
        connection_pool=redis.ConnectionPool(**client.connection_pool.connection_kwargs)
    ) as other:
        assert other.get(key) is None  # still held
    assert client.get(key) == b"held"  # the GET went after the SET, in one round trip


def test_writes_are_held_per_thread(client: DeferringRedis, key: str) -> None:
    client.defer("SET", key, b"from the main thread")
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.append(client.get(key)))
    reader.start()
    reader.join()
    assert seen == [None]  # another thread's command does not carry this thread's writes
    flush(client)
    assert client.get(key) == b"from the main thread"


def test_a_failing_held_write_does_not_fail_the_command_that_carries_it(
    client: DeferringRedis, key: str
) -> None:
    client.set(key, b"not a number")
    client.defer("INCR", key)  # fails: the value is not an integer
    client.defer("SET", f"{key}:after", b"still written")
    assert client.get(key) == b"not a number"
    assert client.get(f"{key}:after") == b"still written"


def test_the_carrying_commands_own_error_is_raised_and_scripts_reload(
    client: DeferringRedis, key: str
) -> None:
    echo = client.register_script("return ARGV[1]")
    client.script_flush()
    client.defer("SET", key, b"held")
    # EVALSHA fails with NOSCRIPT inside the pipeline; the script object must see that error
    # and load the script, as it does without held writes.
    assert echo(args=["back"]) == b"back"
    assert client.get(key) == b"held"
    with pytest.raises(redis.ResponseError):
        client.defer("SET", f"{key}:2", b"x")
        client.execute_command("NO-SUCH-COMMAND")
    assert client.get(f"{key}:2") == b"x"


def test_write_later_sends_at_once_on_a_plain_client(settings: Settings, key: str) -> None:
    with connect_redis(settings, OPERATOR) as plain:
        write_later(plain, "SET", key, b"now")
        assert plain.get(key) == b"now"
        flush(plain)  # nothing held, nothing to do
