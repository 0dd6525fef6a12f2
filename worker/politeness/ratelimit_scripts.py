"""The Lua scripts RateLimiter (worker/politeness/ratelimit.py) runs in Redis, one for each decision it
makes atomically: reserve a slot, clear a send (a held slot's together with its concurrency
lease), space the next send from now, pause, slow down (the rate recovers by itself, in time).

They are apart from the limiter's Python because they are read on their own terms, against the
keys and arguments each one's comment lays out; RateLimiter only packs those and reads the
replies. Redis caches a script by the SHA of its text, so any edit here, whitespace included,
makes a new script.
"""

from __future__ import annotations

# The adaptive slow-down (docs/POLITENESS.md), read by every script that spaces requests: the
# domain's rate now, as a fraction of its configured rate, from its backoff hash (`w0`: the
# fraction it was cut to, `wmax`: the one it grows back towards, `at`: when, µs). Each
# slow-down cuts the rate to BETA of what it was; it then grows back along a cubic in time (the
# shape of TCP CUBIC's window, RFC 8312, as in adaptive client-side token buckets): quickly at
# first, flat near `wmax`, so it lingers just below the rate that was refused, then faster again
# past it, probing for more. Times counted in units of the recovery time R (ARGV):
# w(t) = (1 - BETA)(t - K)^3 + wmax with K = cbrt((wmax - w0) / (1 - BETA)), so w(0) = w0 and
# w(K) = wmax; a cut from the configured rate is back to it after R. No key, or one without
# `wmax`: the configured rate.
_RATE_FRACTION_LUA = """
local BETA = 0.7
local function rate_fraction(key, now, recovery_us)
  local wmax = tonumber(redis.call('HGET', key, 'wmax') or '0')
  if wmax <= 0 then
    return 1
  end
  local w0 = tonumber(redis.call('HGET', key, 'w0') or tostring(BETA * wmax))
  local since = (now - tonumber(redis.call('HGET', key, 'at') or '0')) / recovery_us
  local w = (1 - BETA) * (since - ((wmax - w0) / (1 - BETA)) ^ (1 / 3)) ^ 3 + wmax
  if w < w0 then
    w = w0
  end
  if w > 1 then
    w = 1
  end
  return w
end
"""

# KEYS  1 TAT (µs of the server clock)  2 pause  3 backoff hash  4 inflight leases  5 latest send
# ARGV  1 emission interval µs (1e6 / rate)  2 burst tolerance µs  3 longest acceptable wait µs
#       4 concurrency cap (0 = none)  5 lease length µs after the wait  6 lease id
#       7 longest wait µs that takes a lease: a slot further off is reserved without one (and
#         unchecked against the cap), for a caller that holds its URL and takes the lease when
#         it sends (CLEAR_HELD_LUA); waiting, it is not in flight
#       8 recovery time µs of the slow-down  9 jitter: a fraction of the interval (RATE_JITTER,
#         drawn by the caller) added to this slot's, so the requests are not evenly spaced
# Returns {reserved 0|1, wait µs, reason, backoff multiplier, cleared 0|1}. Refused
# reservations write nothing. A slot due at once also gets the clear-to-send check below, in
# the same call, with the (stretched) interval as the spacing: cleared=1 means it is recorded
# as sent, saving the caller a second round trip on most requests. Numbers leave Lua
# truncated to integers, and tostring() keeps 14 digits only, so large numbers are formatted
# with %.0f.
RESERVE_LUA = (
    _RATE_FRACTION_LUA
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local multiplier = 1 / rate_fraction(KEYS[3], now, tonumber(ARGV[8]))
local interval = tonumber(ARGV[1]) * multiplier
local tolerance = tonumber(ARGV[2]) * multiplier
local max_wait = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
local start = tat - tolerance
local reason = 'rate'
local pause_ms = redis.call('PTTL', KEYS[2])
if pause_ms > 0 then
  local pause_end = now + pause_ms * 1000
  if pause_end > start then
    start = pause_end
    reason = 'paused'
  end
  if pause_end > tat then
    tat = pause_end
  end
end
local wait = start - now
if wait < 0 then
  wait = 0
end
if wait > max_wait then
  return {0, math.ceil(wait), reason, tostring(multiplier)}
end
if cap > 0 and wait > tonumber(ARGV[7]) then
  cap = 0
end
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%.0f', now))
  if redis.call('ZCARD', KEYS[4]) >= cap then
    return {0, math.ceil(wait), 'busy', tostring(multiplier)}
  end
end
local new_tat = tat + interval * (1 + tonumber(ARGV[9]))
-- Once the TAT is in the past the key means nothing, so let it expire then; idle
-- domains vanish.
local ttl_ms = math.ceil((new_tat - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl_ms)
if cap > 0 then
  local expires = now + wait + tonumber(ARGV[5])
  redis.call('ZADD', KEYS[4], string.format('%.0f', expires), ARGV[6])
  local lease_ms = math.ceil((expires - now) / 1000) + 1
  if redis.call('PTTL', KEYS[4]) < lease_ms then
    redis.call('PEXPIRE', KEYS[4], lease_ms)
  end
end
local cleared = 0
if wait <= 0 then
  local due = tonumber(redis.call('GET', KEYS[5]) or '0') + interval
  if now >= due then
    redis.call('SET', KEYS[5], string.format('%.0f', now), 'PX', math.ceil(interval / 1000) + 1)
    cleared = 1
  end
end
return {1, math.ceil(wait), 'ok', tostring(multiplier), cleared}
"""
)

# KEYS 1 latest send (µs)  2 pause  3 backoff hash   ARGV 1 least spacing µs at the configured
# rate  2 how far ahead a send may be cleared µs  3 recovery time µs of the slow-down. The part
# both send checks below share: refused while the domain is paused, or while the previous
# request went out less than the spacing ago (stretched by the domain's slow-down now, so a
# slot reserved before a slow-down leaves at the slower rate too), unless what is left of the
# spacing is within the second argument; leaves `now`, `spacing` and `wait` (what is left) set.
_PAUSE_AND_SPACING_LUA = (
    _RATE_FRACTION_LUA
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local pause_ms = redis.call('PTTL', KEYS[2])
if pause_ms > 0 then
  return {0, pause_ms * 1000, 'paused'}
end
local spacing = tonumber(ARGV[1]) / rate_fraction(KEYS[3], now, tonumber(ARGV[3]))
local wait = tonumber(redis.call('GET', KEYS[1]) or '0') + spacing - now
if wait <= 0 then
  wait = 0
elseif wait > tonumber(ARGV[2]) then
  return {0, math.ceil(wait), 'spacing'}
end
"""
)
# The send, recorded at the moment it may go: now, or `wait` from now.
_RECORD_SEND_LUA = """
redis.call('SET', KEYS[1], string.format('%.0f', now + wait), 'PX', math.ceil((wait + spacing) / 1000) + 1)
"""
# The last word before a request leaves. ARGV 2 is 0: cleared only for now.
# Returns {cleared 0|1, wait µs, reason}.
CLEAR_TO_SEND_LUA = (
    _PAUSE_AND_SPACING_LUA
    + _RECORD_SEND_LUA
    + """
return {1, 0, 'ok'}
"""
)

# KEYS 1 latest send (µs)  2 pause  3 backoff hash  4 inflight leases   ARGV 1 least spacing
# µs  2 how far ahead it may be cleared µs  3 recovery µs  4 cap (0 = none)  5 lease length µs
# 6 lease id. The send of a
# slot reserved ahead: the clear-to-send check above, and the concurrency lease the
# reservation left for now, in one step; nothing is written unless both pass. Cleared with a
# wait, the caller sleeps that long and sends. Returns {cleared 0|1, wait µs, reason}.
CLEAR_HELD_LUA = (
    _PAUSE_AND_SPACING_LUA
    + """
local cap = tonumber(ARGV[4])
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%.0f', now))
  if redis.call('ZCARD', KEYS[4]) >= cap then
    return {0, 0, 'busy'}
  end
  local expires = now + wait + tonumber(ARGV[5])
  redis.call('ZADD', KEYS[4], string.format('%.0f', expires), ARGV[6])
  local lease_ms = math.ceil((expires - now) / 1000) + 1
  if redis.call('PTTL', KEYS[4]) < lease_ms then
    redis.call('PEXPIRE', KEYS[4], lease_ms)
  end
end
"""
    + _RECORD_SEND_LUA
    + """
return {1, math.ceil(wait), 'ok'}
"""
)

# KEYS 1 latest send (µs)   ARGV 1 least spacing µs. The latest send moves up to now, if it is
# earlier, so the next request is spaced from now: from an answer, or from a send that left late.
SPACE_FROM_NOW_LUA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if tonumber(redis.call('GET', KEYS[1]) or '0') < now then
  redis.call('SET', KEYS[1], string.format('%.0f', now), 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1)
  return 1
end
return 0
"""

# KEYS 1 pause   ARGV 1 pause length ms. A pause only ever grows: a shorter Retry-After
# from a concurrent answer must not cut a longer one short.
PAUSE_LUA = """
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
  return 1
end
return 0
"""

# KEYS 1 backoff hash  2 latest send   ARGV 1 interval µs at the configured rate  2 smallest fraction of it
# 3 recovery time µs  4 why (429, 503, 403, latency)  5 such answers that make a slow-down
# (1, or a burst of more: a single 403 is one forbidden page)  6 the window µs they must come
# in. Answers to requests already in flight report the same overload, so the rate is cut at
# most once per (slowed) interval; the key expires once the rate is back where it was
# configured. A cut makes the latest send last the slowed spacing: the send checks space the
# next request from it. Returns {the fraction now (after any cut), 1 if it was cut now}.
SLOW_DOWN_LUA = (
    _RATE_FRACTION_LUA
    + """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local recovery = tonumber(ARGV[3])
local w = rate_fraction(KEYS[1], now, recovery)
local window = tonumber(ARGV[6])
if tonumber(ARGV[5]) > 1 then
  local counted = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
  if now - tonumber(redis.call('HGET', KEYS[1], 'n_at') or '0') > window then
    counted = 0
    redis.call('HSET', KEYS[1], 'n_at', string.format('%.0f', now))
  end
  counted = counted + 1
  redis.call('HSET', KEYS[1], 'n', counted)
  if counted < tonumber(ARGV[5]) then
    if redis.call('PTTL', KEYS[1]) < window / 1000 then
      redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
    end
    return {tostring(w), 0}
  end
  redis.call('HDEL', KEYS[1], 'n', 'n_at')
end
local cut = 0
if now - tonumber(redis.call('HGET', KEYS[1], 'at') or '0') >= tonumber(ARGV[1]) / w then
  -- Refused below the rate it was growing back towards: that rate was too high, so aim a
  -- little under where it was refused this time (RFC 8312's fast convergence).
  local previous = tonumber(redis.call('HGET', KEYS[1], 'wmax') or '0')
  local wmax = w
  if w < previous then
    wmax = w * (1 + BETA) / 2
  end
  w = math.max(BETA * w, tonumber(ARGV[2]))
  wmax = math.max(wmax, w)
  redis.call('HSET', KEYS[1], 'wmax', tostring(wmax), 'w0', tostring(w), 'at', string.format('%.0f', now),
    'why', ARGV[4])
  cut = 1
  if redis.call('PTTL', KEYS[2]) > 0 then
    redis.call('PEXPIRE', KEYS[2], math.ceil(tonumber(ARGV[1]) / w / 1000) + 1)
  end
end
local wmax = tonumber(redis.call('HGET', KEYS[1], 'wmax') or '0')
local left = 0
if wmax > 0 then
  local w0 = tonumber(redis.call('HGET', KEYS[1], 'w0'))
  local since = (now - tonumber(redis.call('HGET', KEYS[1], 'at'))) / recovery
  left = (((wmax - w0) / (1 - BETA)) ^ (1 / 3) + ((1 - wmax) / (1 - BETA)) ^ (1 / 3) - since) * recovery
end
if redis.call('HEXISTS', KEYS[1], 'n') == 1 then
  left = math.max(left, window)
end
redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil(left / 1000)))
return {tostring(w), cut}
"""
)
