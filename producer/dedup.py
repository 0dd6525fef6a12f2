"""Run-wide URL dedup in Redis, safe against crashes and against several producers at once.

A fingerprint (shared.urls.fingerprint, 10 bytes) is stored as field = bytes 2..10 in the hash
Keys.seen(run_id, hex of bytes 0..2). 65,536 small hashes stay in Redis's compact listpack
encoding (about 20 bytes a URL, against about 136 for a set of whole URLs).

A field is in one of these states:
    o:<owner>        claimed: the producer process <owner> is publishing it
    'c'              confirmed: the broker has it
    'h'              handled: a worker has settled it (worker/handled.py)
    <epoch seconds>  claimed by an older producer, whose lease ran until then

A URL is marked seen ('c') only once its publish is confirmed, and un-marked if the publish
fails, so a crash between the two cannot make a URL disappear: a crash leaves at most a claim.

Every producer process names itself with a random owner id and keeps a heartbeat key,
Keys.producer_heartbeat(run, owner), alive while it runs (producer/liveness.py, and every
claim call refreshes it). A claim whose owner's heartbeat has lapsed belongs to a dead producer:
the next claim of that URL takes it over (TAKEN), and the URL is published again. One whose
owner is still alive is BUSY: the caller asks again later, until the owner confirms it (then
it is a duplicate), releases it or dies. So a producer re-run at once after a kill -9 publishes
every URL the dead one did not confirm, and skips none in silence. A URL whose fate was unknown
(published, confirm not received) may thus be published twice; the worker's handled mark keeps
the second copy from being fetched or counted again.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

import redis
import redis.exceptions

from shared.keys import Keys

log = logging.getLogger(__name__)

# A producer is dead once its heartbeat key is this old. Far longer than a pause between two
# beats (producer/liveness.py beats every second); short, because a re-run right after a crash
# waits this long at most for the dead producer's claims.
HEARTBEAT_TTL_MS = 5000

# Outcomes of a claim, one per fingerprint.
DUP, NEW, TAKEN, BUSY = 0, 1, 2, 3

# KEYS[1] is the run's stats hash, KEYS[i + 1] the hash of fingerprint i. ARGV[1] is the
# caller's owner id, ARGV[2] the prefix of heartbeat keys (owner id appended), ARGV[3] the
# heartbeat's TTL in ms, ARGV[i + 3] field i. Refreshes the caller's own heartbeat, and counts
# takeovers in the stats hash as they happen (`taken_over`): a kill -9 cannot lose that count,
# and no URL reaches the broker more often than once plus its takeovers. Returns one outcome
# per fingerprint: NEW and TAKEN are now claimed by the caller; DUP is confirmed or handled,
# or claimed by the caller already (a repeat); BUSY is claimed by a producer that is alive.
# Each other owner's heartbeat is looked up once per call. One script call per batch: atomic,
# one round trip.
CLAIM_SCRIPT = """
local owner = ARGV[1]
local mine = 'o:' .. owner
local prefix = ARGV[2]
redis.call('SET', prefix .. owner, '1', 'PX', tonumber(ARGV[3]))
local now = nil
local alive = {}
local result = {}
local taken = 0
for i = 2, #KEYS do
  local key = KEYS[i]
  local field = ARGV[i + 2]
  local state = redis.call('HGET', key, field)
  local outcome = 0
  if not state then
    outcome = 1
  elseif state == 'c' or state == 'h' or state == mine then
    outcome = 0
  elseif string.sub(state, 1, 2) == 'o:' then
    local holder = string.sub(state, 3)
    local live = alive[holder]
    if live == nil then
      live = redis.call('EXISTS', prefix .. holder) == 1
      alive[holder] = live
    end
    outcome = live and 3 or 2
  else
    now = now or tonumber(redis.call('TIME')[1])
    local expiry = tonumber(state)
    outcome = (expiry ~= nil and expiry > now) and 3 or 2
  end
  if outcome == 1 or outcome == 2 then
    redis.call('HSET', key, field, mine)
  end
  if outcome == 2 then
    taken = taken + 1
  end
  result[i - 1] = outcome
end
if taken > 0 then
  redis.call('HINCRBY', KEYS[1], 'taken_over', taken)
end
return result
"""

# Un-mark fields, but only claims that are still the caller's (ARGV[1] = 'o:<owner>'): a claim
# another producer took over must stay.
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
# One script instead of one pipelined command per URL: far less to encode on the client. A URL
# a worker has handled already (a fast worker, or a copy published before a crash) stays so.
CONFIRM_SCRIPT = """
local counters = tonumber(ARGV[1])
for c = 1, counters do
  redis.call('HINCRBY', KEYS[1], ARGV[2 * c], ARGV[2 * c + 1])
end
local first_field = 2 * counters + 2
for i = 2, #KEYS do
  local field = ARGV[first_field + i - 2]
  if redis.call('HGET', KEYS[i], field) ~= 'h' then
    redis.call('HSET', KEYS[i], field, 'c')
  end
end
return #KEYS - 1
"""


BUCKET_BYTES = 2  # of a fingerprint, naming its hash; the rest is the field


def split_fingerprint(fp: bytes) -> tuple[str, bytes]:
    """(bucket as 4 hex digits, field): the first 2 bytes pick one of 65,536 hashes."""
    return fp[:BUCKET_BYTES].hex(), fp[BUCKET_BYTES:]


class Claim:
    """The outcome of claiming one batch: one of DUP, NEW, TAKEN, BUSY per fingerprint, and the
    token that releases the caller's claims."""

    def __init__(self, fingerprints: Sequence[bytes], outcomes: Sequence[int], token: bytes) -> None:
        self.fingerprints = list(fingerprints)
        self.outcomes = list(outcomes)
        self.token = token

    @property
    def is_new(self) -> list[bool]:
        """Claimed by the caller now, to be published: new, or taken over from a dead producer."""
        return [outcome in (NEW, TAKEN) for outcome in self.outcomes]

    @property
    def taken_over(self) -> list[bool]:
        return [outcome == TAKEN for outcome in self.outcomes]

    @property
    def busy(self) -> list[bool]:
        """Claimed by a producer that is alive: neither new nor a duplicate yet."""
        return [outcome == BUSY for outcome in self.outcomes]


class Dedup:
    """Claim, confirm and release fingerprints of one run, as one producer process (`owner`)."""

    def __init__(self, client: redis.Redis, keys: Keys, run_id: str, owner: str = "") -> None:
        self._client = client
        self._keys = keys
        self._run_id = run_id
        self.owner = owner or secrets.token_hex(6)
        self._token = f"o:{self.owner}".encode()
        self._heartbeat_prefix = keys.producer_heartbeat(run_id, "")
        # The key of each bucket's hash, made once: every batch names hundreds of them.
        self._bucket_keys: dict[bytes, str] = {}
        # register_script loads once and calls by EVALSHA, reloading on NOSCRIPT.
        self._claim = client.register_script(CLAIM_SCRIPT)
        self._confirm = client.register_script(CONFIRM_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    def beat(self) -> None:
        """Say this producer is alive for HEARTBEAT_TTL_MS more."""
        self._client.set(self._heartbeat_prefix + self.owner, b"1", px=HEARTBEAT_TTL_MS)

    def stop_beating(self) -> None:
        """Say this producer is gone, once it holds no claims: a later run need not wait."""
        self._client.delete(self._heartbeat_prefix + self.owner)

    def claim(self, fingerprints: Sequence[bytes]) -> Claim:
        """Claim a batch in one atomic call; a fingerprint repeated in the batch is new once."""
        if not fingerprints:
            return Claim([], [], self._token)
        keys, fields = self._locate(fingerprints)
        reply = self._claim(
            keys=[self._keys.run_stats(self._run_id), *keys],
            args=[self.owner, self._heartbeat_prefix, HEARTBEAT_TTL_MS, *fields],
        )
        return Claim(fingerprints, [int(outcome) for outcome in reply], self._token)

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
