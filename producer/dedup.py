"""Run-wide URL dedup in Redis, safe against crashes and against several producers at once.

A fingerprint (shared.urls.fingerprint, 10 bytes) is stored as field = bytes 2..10 in the hash
Keys.seen(run_id, hex of bytes 0..2). 65,536 small hashes stay in Redis's compact listpack
encoding (about 20 bytes a URL, against about 136 for a set of whole URLs).

A field is in one of two states:
    <epoch seconds>  claimed: a producer is publishing it, its lease runs until then
    'c'              confirmed: the broker has it

A URL is marked seen ('c') only once its publish is confirmed, and un-marked if the publish
fails, so a crash between the two cannot make a URL disappear: a crash leaves at most a
claim, whose lease runs out, and the next producer run with the same run id claims and
publishes the URL again. The price is that such a URL may be published twice, which workers
tolerate (delivery is at-least-once anyway).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import redis
import redis.exceptions

from shared.errors import ServiceUnavailable
from shared.keys import Keys
from shared.settings import Settings, redact

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 300  # far longer than publishing one batch takes
START_HINT = "start it with: redis-server --daemonize yes"

# KEYS[i] is the hash of fingerprint i, ARGV[i + 1] its field; ARGV[1] is the lease in seconds.
# Returns {lease expiry, claim_1, ..., claim_n} with claim_i = 1 (NEW, now claimed by the
# caller) or 0 (DUP: confirmed, or claimed by someone whose lease still runs).
# One script call per batch: atomic, and one round trip whatever the batch size.
CLAIM_SCRIPT = """
local now = tonumber(redis.call('TIME')[1])
local expiry = now + tonumber(ARGV[1])
local result = {expiry}
for i, key in ipairs(KEYS) do
  local field = ARGV[i + 1]
  local state = redis.call('HGET', key, field)
  local claimable = not state
  if state and state ~= 'c' then
    claimable = tonumber(state) == nil or tonumber(state) <= now
  end
  if claimable then
    redis.call('HSET', key, field, expiry)
    result[i + 1] = 1
  else
    result[i + 1] = 0
  end
end
return result
"""

# Un-mark fields, but only claims that are still the caller's (same lease expiry): if the lease
# ran out and another producer claimed the URL, its claim must stay.
RELEASE_SCRIPT = """
local released = 0
for i, key in ipairs(KEYS) do
  local field = ARGV[i + 1]
  if redis.call('HGET', key, field) == ARGV[1] then
    redis.call('HDEL', key, field)
    released = released + 1
  end
end
return released
"""


# KEYS[1] is the run's stats hash, KEYS[i + 1] the hash of fingerprint i; ARGV[1] is the number
# n of counters, ARGV[2 .. 2n + 1] their names and increments, then the fields in KEYS order.
# One script instead of one pipelined command per URL: far less to encode on the client.
CONFIRM_SCRIPT = """
local counters = tonumber(ARGV[1])
for c = 1, counters do
  redis.call('HINCRBY', KEYS[1], ARGV[2 * c], ARGV[2 * c + 1])
end
local first_field = 2 * counters + 2
for i = 2, #KEYS do
  redis.call('HSET', KEYS[i], ARGV[first_field + i - 2], 'c')
end
return #KEYS - 1
"""


BUCKET_BYTES = 2  # of a fingerprint, naming its hash; the rest is the field


def split_fingerprint(fp: bytes) -> tuple[str, bytes]:
    """(bucket as 4 hex digits, field): the first 2 bytes pick one of 65,536 hashes."""
    return fp[:BUCKET_BYTES].hex(), fp[BUCKET_BYTES:]


@contextlib.contextmanager
def redis_errors(settings: Settings) -> Iterator[None]:
    """Redis connection trouble becomes ServiceUnavailable, with the address and a hint."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        detail = (str(exc) or exc.__class__.__name__).splitlines()[0]
        raise ServiceUnavailable("Redis", redact(settings.redis_url), detail, START_HINT) from None


def connect_redis(settings: Settings) -> redis.Redis:
    """A client for binary fields (no decoding), checked with a PING."""
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=30, socket_connect_timeout=5)
    with redis_errors(settings):
        try:
            client.ping()
        except BaseException:
            client.close()
            raise
    return client


class Claim:
    """The outcome of claiming one batch: which fingerprints are new, and the lease token."""

    def __init__(self, fingerprints: Sequence[bytes], is_new: Sequence[bool], token: bytes) -> None:
        self.fingerprints = list(fingerprints)
        self.is_new = list(is_new)
        self.token = token


class Dedup:
    """Claim, confirm and release fingerprints of one run."""

    def __init__(self, client: redis.Redis, keys: Keys, run_id: str, lease_s: int = DEFAULT_LEASE_S) -> None:
        self._client = client
        self._keys = keys
        self._run_id = run_id
        self._lease_s = lease_s
        # The key of each bucket's hash, made once: every batch names hundreds of them.
        self._bucket_keys: dict[bytes, str] = {}
        # register_script loads once and calls by EVALSHA, reloading on NOSCRIPT.
        self._claim = client.register_script(CLAIM_SCRIPT)
        self._confirm = client.register_script(CONFIRM_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    def claim(self, fingerprints: Sequence[bytes]) -> Claim:
        """Claim a batch in one atomic call; a fingerprint repeated in the batch is new once."""
        if not fingerprints:
            return Claim([], [], b"")
        keys, fields = self._locate(fingerprints)
        reply = self._claim(keys=keys, args=[self._lease_s, *fields])
        token = str(reply[0]).encode()
        return Claim(fingerprints, [flag == 1 for flag in reply[1:]], token)

    def confirm(self, fingerprints: Sequence[bytes], counters: dict[str, int] | None = None) -> None:
        """Mark published fingerprints seen for good and add `counters` to the run's stats hash,
        in one round trip."""
        keys, fields = self._locate(fingerprints)
        increments = [item for name, n in (counters or {}).items() if n for item in (name, n)]
        if not keys and not increments:
            return
        self._confirm(
            keys=[self._keys.run_stats(self._run_id), *keys],
            args=[len(increments) // 2, *increments, *fields],
        )

    def release(self, fingerprints: Sequence[bytes], token: bytes) -> int:
        """Un-mark claims whose publish failed, so a later run can publish them."""
        if not fingerprints:
            return 0
        keys, fields = self._locate(fingerprints)
        return int(self._release(keys=keys, args=[token, *fields]))

    def _locate(self, fingerprints: Sequence[bytes]) -> tuple[list[str], list[bytes]]:
        keys: list[str] = []
        fields: list[bytes] = []
        bucket_keys = self._bucket_keys
        for fp in fingerprints:
            key = bucket_keys.get(fp[:BUCKET_BYTES])
            if key is None:
                key = bucket_keys[fp[:BUCKET_BYTES]] = self._keys.seen(self._run_id, split_fingerprint(fp)[0])
            keys.append(key)
            fields.append(fp[BUCKET_BYTES:])
        return keys, fields
