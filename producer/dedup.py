"""Run-wide URL dedup in Redis, safe against crashes and against several producers at once.

A fingerprint (shared.urls.fingerprint, 10 bytes) is stored as field = bytes 2..10 in the hash
Keys.seen(run_id, hex of bytes 0..2). 65,536 small hashes stay in Redis's compact listpack
encoding (about 20 bytes a URL, against about 136 for a set of whole URLs).

A field is in one of these states:
    o:<owner>        claimed: the producer process <owner> is publishing it
    'c'              confirmed: the broker has it
    'h'              handled: a worker has settled it (worker/handling/handled.py)
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
from redis.cluster import RedisCluster

from shared.redis.cluster import by_slot
from shared.redis.keys import Keys

log = logging.getLogger(__name__)

# A producer is dead once its heartbeat key is this old. Far longer than a pause between two
# beats (producer/liveness.py beats every second); short, because a re-run right after a crash
# waits this long at most for the dead producer's claims.
HEARTBEAT_TTL_MS = 5000

# Outcomes of a claim, one per fingerprint.
DUP, NEW, TAKEN, BUSY = 0, 1, 2, 3
# From the script only: claimed by the caller already (Dedup._settle_repeats decides what it is).
MINE = 4

# KEYS[1 .. s] are the run's stats hash (s = ARGV[1], 1, or 0 on a Redis Cluster, where that
# hash lives in another slot), then KEYS[s + i] the hash of fingerprint i. ARGV[2] is the
# caller's owner id, ARGV[3] the prefix of heartbeat keys (owner id appended), ARGV[4] the
# heartbeat's TTL in ms, ARGV[4 + i] field i. Refreshes the caller's own heartbeat, and counts
# takeovers in the stats hash as they happen (`taken_over`): a kill -9 cannot lose that count,
# and no URL reaches the broker more often than once plus its takeovers. Returns one outcome
# per fingerprint: NEW and TAKEN are now claimed by the caller; DUP is confirmed or handled;
# MINE claimed by the caller already (a repeat, or a retry after a lost reply); BUSY is
# claimed by a producer that is alive. Each other owner's heartbeat is looked up once per
# call. One script call per batch (per slot on a cluster): atomic, one round trip.
CLAIM_SCRIPT = """
local stats = tonumber(ARGV[1])
local owner = ARGV[2]
local mine = 'o:' .. owner
local prefix = ARGV[3]
redis.call('SET', prefix .. owner, '1', 'PX', tonumber(ARGV[4]))
local now = nil
local alive = {}
local result = {}
local taken = 0
for i = stats + 1, #KEYS do
  local key = KEYS[i]
  local field = ARGV[i - stats + 4]
  local state = redis.call('HGET', key, field)
  local outcome = 0
  if not state then
    outcome = 1
  elseif state == 'c' or state == 'h' then
    outcome = 0
  elseif state == mine then
    outcome = 4
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
  result[i - stats] = outcome
end
if taken > 0 and stats == 1 then
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


# KEYS[1 .. s] are the run's stats hash (s = ARGV[1], 0 or 1 as for claims), then KEYS[s + i]
# the hash of fingerprint i; ARGV[2] is the number n of counters (0 when s = 0), ARGV[3 ..
# 2n + 2] their names and increments, then the fields in KEYS order. One script instead of one
# pipelined command per URL: far less to encode on the client. A URL a worker has handled
# already (a fast worker, or a copy published before a crash) stays so.
CONFIRM_SCRIPT = """
local stats = tonumber(ARGV[1])
local counters = tonumber(ARGV[2])
for c = 1, counters do
  redis.call('HINCRBY', KEYS[1], ARGV[2 * c + 1], ARGV[2 * c + 2])
end
local first_field = 2 * counters + 3
for i = stats + 1, #KEYS do
  local field = ARGV[first_field + i - stats - 1]
  if redis.call('HGET', KEYS[i], field) ~= 'h' then
    redis.call('HSET', KEYS[i], field, 'c')
  end
end
return #KEYS - stats
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
    """Claim, confirm and release fingerprints of one run, as one producer process (`owner`).

    On a Redis Cluster the buckets of one batch live in many slots, and a script may touch one
    slot only: each call is split by bucket group (shared/redis/keys.py puts the run and the first
    byte of the bucket in the hash tag), the run's counters are added by a command of their own
    after the marks, and the heartbeat is kept once per bucket group, where the claim script of
    that group reads it. What that costs: a producer killed between the marks and the counters
    leaves those counters short; a reply lost in a failover is covered as in standalone mode
    (MINE below)."""

    def __init__(self, client: redis.Redis, keys: Keys, run_id: str, owner: str = "") -> None:
        self._client = client
        self._keys = keys
        self._run_id = run_id
        self.owner = owner or secrets.token_hex(6)
        self._token = f"o:{self.owner}".encode()
        self._cluster = isinstance(client, RedisCluster)
        self._heartbeat_prefix = keys.producer_heartbeat(run_id, "")
        # The key of each bucket's hash, made once: every batch names hundreds of them.
        self._bucket_keys: dict[bytes, str] = {}
        # Claimed by a call that failed (its reply may be lost after it ran): the next call may
        # find them claimed by this producer already, and they are still to be published.
        self._unsettled: set[bytes] = set()
        # register_script loads once and calls by EVALSHA, reloading on NOSCRIPT.
        self._claim = client.register_script(CLAIM_SCRIPT)
        self._confirm = client.register_script(CONFIRM_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    def beat(self) -> None:
        """Say this producer is alive for HEARTBEAT_TTL_MS more, and the run is being seeded."""
        own = self._group_heartbeats() if self._cluster else [self._heartbeat_prefix + self.owner]
        with self._client.pipeline(transaction=False) as pipe:
            for key in own:
                pipe.set(key, b"1", px=HEARTBEAT_TTL_MS)
            # Not removed by stop_beating: another producer of the run may still beat. It lapses
            # with the last one's heartbeat.
            pipe.set(self._keys.run_producing(self._run_id), b"1", px=HEARTBEAT_TTL_MS)
            pipe.execute()

    def stop_beating(self) -> None:
        """Say this producer is gone, once it holds no claims: a later run need not wait."""
        if not self._cluster:
            self._client.delete(self._heartbeat_prefix + self.owner)
            return
        with self._client.pipeline(transaction=False) as pipe:
            for key in self._group_heartbeats():
                pipe.delete(key)
            pipe.execute()

    def claim(self, fingerprints: Sequence[bytes]) -> Claim:
        """Claim a batch in one atomic call (one per bucket group on a cluster); a fingerprint
        repeated in the batch is new once."""
        if not fingerprints:
            return Claim([], [], self._token)
        retried = self._unsettled.intersection(fingerprints)
        self._unsettled.update(fingerprints)
        keys, fields = self._locate(fingerprints)
        if self._cluster:
            raw = [0] * len(fingerprints)
            taken = 0
            for group_keys, positions in self._by_group(keys):
                reply = self._claim(
                    keys=group_keys,
                    args=[
                        0,
                        self.owner,
                        self._group_heartbeat_prefix(group_keys[0]),
                        HEARTBEAT_TTL_MS,
                        *(fields[i] for i in positions),
                    ],
                )
                for i, outcome in zip(positions, reply, strict=True):
                    raw[i] = int(outcome)
                    taken += int(outcome) == TAKEN
            if taken:
                self._client.hincrby(self._keys.run_stats(self._run_id), "taken_over", taken)
        else:
            reply = self._claim(
                keys=[self._keys.run_stats(self._run_id), *keys],
                args=[1, self.owner, self._heartbeat_prefix, HEARTBEAT_TTL_MS, *fields],
            )
            raw = [int(outcome) for outcome in reply]
        outcomes = self._settle_repeats(fingerprints, raw, retried)
        self._unsettled.difference_update(fingerprints)
        return Claim(fingerprints, outcomes, self._token)

    def confirm(self, fingerprints: Sequence[bytes], counters: dict[str, int] | None = None) -> None:
        """Mark published fingerprints seen for good and add `counters` to the run's stats hash,
        in one round trip (on a cluster: one per bucket group, then one for the counters)."""
        keys, fields = self._locate(fingerprints)
        increments = [item for name, n in (counters or {}).items() if n for item in (name, n)]
        if not keys and not increments:
            return
        if not self._cluster:
            self._confirm(
                keys=[self._keys.run_stats(self._run_id), *keys],
                args=[1, len(increments) // 2, *increments, *fields],
            )
            return
        for group_keys, positions in self._by_group(keys):
            self._confirm(keys=group_keys, args=[0, 0, *(fields[i] for i in positions)])
        if increments:
            stats = self._keys.run_stats(self._run_id)
            with self._client.pipeline(transaction=False) as pipe:
                for name, n in (counters or {}).items():
                    if n:
                        pipe.hincrby(stats, name, n)
                pipe.execute()

    def release(self, fingerprints: Sequence[bytes], token: bytes) -> int:
        """Un-mark claims whose publish failed, so a later run can publish them."""
        if not fingerprints:
            return 0
        keys, fields = self._locate(fingerprints)
        if not self._cluster:
            return int(self._release(keys=keys, args=[token, *fields]))
        released = 0
        for group_keys, positions in self._by_group(keys):
            released += int(self._release(keys=group_keys, args=[token, *(fields[i] for i in positions)]))
        return released

    @staticmethod
    def _settle_repeats(fingerprints: Sequence[bytes], raw: list[int], retried: set[bytes]) -> list[int]:
        """MINE becomes NEW for a fingerprint a failed call claimed (the first time only) and DUP
        otherwise: a repeat in the batch, or one claimed by an earlier batch still in flight."""
        outcomes: list[int] = []
        recovered: set[bytes] = set()
        for fp, outcome in zip(fingerprints, raw, strict=True):
            if outcome == MINE:
                if fp in retried and fp not in recovered:
                    recovered.add(fp)
                    outcome = NEW
                else:
                    outcome = DUP
            elif outcome in (NEW, TAKEN):
                recovered.add(fp)
            outcomes.append(outcome)
        return outcomes

    def _by_group(self, keys: list[str]) -> list[tuple[list[str], list[int]]]:
        """The keys of one cluster slot each, with their positions in `keys`."""
        return [(group_keys, positions) for group_keys, positions in by_slot(keys, range(len(keys))).values()]

    def _group_heartbeat_prefix(self, bucket_key: str) -> str:
        group = bucket_key[bucket_key.index("{") + 1 : bucket_key.index("}")].rpartition(":")[2]
        return self._keys.producer_heartbeat(self._run_id, "", group)

    def _group_heartbeats(self) -> list[str]:
        return [self._keys.producer_heartbeat(self._run_id, self.owner, f"{g:02x}") for g in range(256)]

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
