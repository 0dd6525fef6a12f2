"""DeferringRedis against the real Redis: held writes ride along with the thread's next command."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from shared.redis.client import OPERATOR, WORKER, connect_redis
from shared.redis.deferred_writes import DeferringRedis, flush, write_later
from shared.redis.keys import Keys
from shared.redis.runstate import RunStates
from shared.settings import Settings


@pytest.fixture
def client(settings: Settings) -> Iterator[DeferringRedis]:
    made = connect_redis(settings, WORKER, client_class=DeferringRedis)
    assert isinstance(made, DeferringRedis)  # connect_redis is annotated as making a plain Redis
    yield made
    made.close()


def connect_redis_like(client: DeferringRedis) -> redis.Redis:
    """Another client of the same server: what it does is not held by `client`."""
    return redis.Redis(connection_pool=redis.ConnectionPool(**client.connection_pool.connection_kwargs))


@pytest.fixture
def key(settings: Settings) -> str:
    return f"{settings.redis_prefix}:deferred"


def test_a_held_write_is_sent_with_the_next_command_and_before_it(client: DeferringRedis, key: str) -> None:
    client.defer("SET", key, b"held")
    with connect_redis_like(client) as other:
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


def test_a_read_ahead_rides_with_the_next_command_and_answers_the_same_read_once(
    client: DeferringRedis, key: str
) -> None:
    client.set(key, b"before")
    client.read_ahead("GET", key)
    client.ping()  # carries the read
    with connect_redis_like(client) as other:
        other.set(key, b"after")
    assert client.get(key) == b"before"  # answered from the reply: no round trip now
    assert client.get(key) == b"after"  # once only


def test_reads_ahead_ride_together_and_each_is_answered_once(client: DeferringRedis, key: str) -> None:
    client.set(key, b"one")
    client.set(f"{key}:2", b"two")
    client.read_ahead("GET", key)
    client.read_ahead("GET", f"{key}:2")
    client.ping()  # carries both
    with connect_redis_like(client) as other:
        other.set(key, b"one, later")
        other.set(f"{key}:2", b"two, later")
    assert client.get(f"{key}:2") == b"two"
    assert client.get(key) == b"one"
    assert (client.get(key), client.get(f"{key}:2")) == (b"one, later", b"two, later")


def test_a_read_ahead_not_yet_sent_is_the_read_itself_and_carries_the_others(
    client: DeferringRedis, key: str
) -> None:
    client.set(key, b"value")
    client.set(f"{key}:2", b"two")
    client.read_ahead("GET", f"{key}:2")
    client.read_ahead("GET", key)
    assert client.get(key) == b"value"
    with connect_redis_like(client) as other:
        other.set(f"{key}:2", b"two, later")
    assert client.get(f"{key}:2") == b"two"  # went with the first read


def test_a_run_s_state_read_ahead_rides_with_the_next_command(
    client: DeferringRedis, settings: Settings
) -> None:
    keys = Keys(settings.redis_prefix)
    states = RunStates(client, keys)
    states.read_ahead("r1")
    client.ping()  # carries it: the run was running then
    with connect_redis_like(client) as other:
        other.set(keys.run_state("r1"), "paused")
    assert states.state("r1") == "running"
    assert RunStates(client, keys).state("r1") == "paused"  # once only; a fresh copy reads again


def test_a_read_ahead_not_yet_sent_is_the_read_itself(client: DeferringRedis, key: str) -> None:
    client.set(key, b"value")
    client.read_ahead("GET", key)
    assert client.get(key) == b"value"
    client.set(key, b"newer")
    assert client.get(key) == b"newer"  # nothing kept


def test_a_read_ahead_is_per_thread_and_dropped_on_demand(client: DeferringRedis, key: str) -> None:
    client.set(key, b"old")
    client.read_ahead("GET", key)
    client.ping()
    client.set(key, b"new")
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.append(client.get(key)))
    reader.start()
    reader.join()
    assert seen == [b"new"]  # another thread's read is its own
    client.drop_read_ahead()
    assert client.get(key) == b"new"


def test_a_flush_of_held_writes_leaves_the_read_ahead_for_a_command(client: DeferringRedis, key: str) -> None:
    client.set(key, b"old")
    client.read_ahead("GET", key)
    client.defer("SET", f"{key}:held", b"x")
    flush(client)
    with connect_redis_like(client) as other:
        assert other.get(f"{key}:held") == b"x"  # the write went
        other.set(key, b"new")  # the read did not: it will see this
        client.ping()  # carries it
        other.set(key, b"newest")
    assert client.get(key) == b"new"


def test_a_read_ahead_that_failed_is_not_kept(client: DeferringRedis, key: str) -> None:
    client.hset(key, "field", "value")
    client.read_ahead("GET", key)  # WRONGTYPE: the key holds a hash
    client.ping()
    with pytest.raises(redis.ResponseError):
        client.get(key)  # sent again, and meets the error itself


def test_write_later_sends_at_once_on_a_plain_client(settings: Settings, key: str) -> None:
    with connect_redis(settings, OPERATOR) as plain:
        write_later(plain, "SET", key, b"now")
        assert plain.get(key) == b"now"
        flush(plain)  # nothing held, nothing to do
