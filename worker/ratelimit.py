"""A per-domain rate limit shared by every worker: GCRA in one Redis Lua script.

GCRA (the generic cell rate algorithm) keeps a single number per domain, the theoretical
arrival time (TAT) of the next request. A reservation moves the TAT one interval on and
tells the caller how long to wait before fetching. The script reads the clock with
redis.call('TIME'), so workers on hosts with skewed clocks still share one timeline, and it
reads and writes the TAT atomically, so concurrent workers never take the same slot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from shared.keys import Keys
from worker.redis_errors import translate_redis_errors

log = logging.getLogger(__name__)

# KEYS[1]  the domain's TAT, in microseconds of the server clock
# ARGV[1]  emission interval in microseconds (1e6 / rate)
# ARGV[2]  burst tolerance in microseconds (interval * (burst - 1))
# ARGV[3]  longest acceptable wait in microseconds
# Returns {1, wait_us} when the slot was reserved, {0, wait_us} when the wait was too long
# (then nothing is written). Waits are whole microseconds: Redis truncates Lua numbers
# to integers on the way out.
_GCRA_LUA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
local wait = tat - tolerance - now
if wait < 0 then
  wait = 0
end
if wait > max_wait then
  return {0, math.ceil(wait)}
end
local new_tat = tat + interval
-- Once the TAT is in the past the key means nothing, so let it expire then; idle
-- domains vanish. %.0f because tostring() would round to 14 significant digits.
local ttl_ms = math.ceil((new_tat - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl_ms)
return {1, math.ceil(wait)}
"""


@dataclass(frozen=True)
class Reservation:
    """How long to wait before fetching, and whether that slot is now ours.

    reserved=False: the wait would have exceeded max_wait_s, nothing was taken, and `wait_s`
    says how long the caller would have had to wait (e.g. to delay the task elsewhere).
    """

    wait_s: float
    reserved: bool


class RateLimiter:
    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self._client = redis_client
        self._keys = keys
        # register_script sends EVALSHA and reloads the script on NOSCRIPT by itself.
        self._script = redis_client.register_script(_GCRA_LUA)

    def reserve(
        self, domain: str, rate_per_s: float, burst: int = 1, *, max_wait_s: float
    ) -> Reservation:
        """Reserve the domain's next slot if it comes within `max_wait_s`.

        `burst` requests may go back to back after an idle spell; after that they are spaced
        1/rate_per_s apart. With reserved=True the caller sleeps `wait_s`, then fetches.
        """
        if rate_per_s <= 0 or burst < 1 or max_wait_s < 0:
            raise ValueError(
                f"need rate_per_s > 0, burst >= 1, max_wait_s >= 0; got "
                f"{rate_per_s}, {burst}, {max_wait_s}"
            )
        interval_us = 1_000_000 / rate_per_s
        args = [round(interval_us), round(interval_us * (burst - 1)), round(max_wait_s * 1_000_000)]
        # Domains are case-insensitive; one spelling must not get a second budget.
        key = self._keys.rate(domain.lower())
        with translate_redis_errors(self._client):
            reserved, wait_us = self._script(keys=[key], args=args)
        reservation = Reservation(wait_s=int(wait_us) / 1_000_000, reserved=bool(reserved))
        if not reservation.reserved:
            log.debug("rate limit: %s needs %.3f s > %.3f s", domain, reservation.wait_s, max_wait_s)
        return reservation
