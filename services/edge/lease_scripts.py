"""The Redis side of leased admissions (leases.py): Lua run atomically, each one round trip.

Keys per API key (`<prefix>` is the rate limiter's): `<prefix>lease:<key id>`, a sorted set of
the key's live leases (member `<epoch>:<lease id>`, score its expiry in Redis's own clock, ms);
`<prefix>epoch:<key id>`, the key's revocation epoch (moved on by key_revocations.REVOKE);
`<prefix>replicas`, the replicas that leased lately (score: until when they count as live), for
the share of what is left.
"""

from services.edge.admissions import ADMIT_FN
from services.edge.rate_scripts import RATE_LIMIT_FN, REVOKED_FN
from services.edge.user_revocations import USER_CHANGED_FN

# LEASE_SCRIPT's own part, after rate_scripts' functions and ADMIT_FN. KEYS and ARGV as
# rate_scripts.SCRIPT (take = 1, a key check always, its user's when the user's version is >= -1),
# then KEYS: the key's lease registry, its epoch, the replicas; ARGV from `extra` = 8 + 3n +
# 6 * wants: the block wanted, this replica's id, the lease's id, the lease's lifetime (ms), a
# replica's (ms). The first call is judged exactly as SCRIPT judges it; when every admission has
# room, up to `want - 1` more calls are taken at the same `now`, each by the same rate-limit
# arithmetic, within every api_calls limit's share (what is left divided by the live replicas, at
# least 1), and within what every subject's bucket and window still let through at `now` (taken
# in one write, not call by call: a block costs Redis what one call does).
# Returns SCRIPT's answer (its headers: the limits after the block), then the block taken (0: not
# judged, or no room) and the key's epoch, then the slots.
LEASE_BODY = """
local wants = tonumber(ARGV[3])
local known = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local limits = {}
for i = 1, n do
  limits[i] = {tonumber(ARGV[4 + 3 * i]), tonumber(ARGV[5 + 3 * i]), tonumber(ARGV[6 + 3 * i])}
end
local user_known = tonumber(ARGV[7 + 3 * n + 6 * wants])
local extra = 8 + 3 * n + 6 * wants
local want = tonumber(ARGV[extra])
local how = revoked_after(KEYS[n + 1], known)
if how then
  return {-1, how}
end
local o = n + 1  -- the last KEYS before the admissions: the revocation entry, or the user's entry
if user_known >= -1 then
  o = n + 2
  how = user_changed(KEYS[o], user_known)
  if how then
    return {-1, how}
  end
end
local subjects = {}
for i = 1, n do subjects[i] = KEYS[i] end
local allowed, size, remaining, reset, retry, stored, next_refused = rate_limit(subjects, now, limits, ttl, true)
local admitted, block, epoch = -1, 0, 0
if allowed and wants > 0 then
  admitted = 0
  local counts, lefts = {}, {}
  for i = 1, wants do
    local count, fits, left = room(KEYS[o + i], ARGV, 7 + 3 * n + (i - 1) * 6)
    counts[i], lefts[i] = count, left
    if not fits and admitted == 0 then admitted = i end
  end
  if admitted == 0 then
    local t = redis.call('TIME')
    local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local replicas = KEYS[o + 3 + wants]
    redis.call('ZADD', replicas, ms + tonumber(ARGV[extra + 4]), ARGV[extra + 1])
    redis.call('ZREMRANGEBYSCORE', replicas, '-inf', ms)
    redis.call('PEXPIRE', replicas, tonumber(ARGV[extra + 4]))
    local live = math.max(1, redis.call('ZCARD', replicas))
    local share = want
    for i = 1, wants do share = math.min(share, math.max(1, math.floor(lefts[i] / live))) end
    -- the calls after this one that every subject's bucket and window let through at `now`
    -- (each needs a whole token and room for one more in the window), all taken in one write
    local more = share - 1
    for i, h in ipairs(stored) do
      local tokens, wstart, cur, prev = tonumber(h[1]), tonumber(h[3]), tonumber(h[4]), tonumber(h[5])
      local est = prev * math.max(0.0, (60.0 - math.max(0.0, now - wstart)) / 60.0) + cur
      more = math.min(more, math.floor(tokens), math.floor(limits[i][3] - est))
    end
    block = 1
    if more > 0 then
      block = 1 + more
      for i, h in ipairs(stored) do
        redis.call('HSET', subjects[i], 'tokens', string.format('%.17g', tonumber(h[1]) - more),
          'cur', string.format('%.17g', tonumber(h[4]) + more))
      end
      -- the headers as the limits stand after the block: the room left now, taking nothing
      local _
      _, size, remaining, reset, retry, stored, next_refused = rate_limit(subjects, now, limits, ttl, false)
      retry = 0
    end
    for i = 1, wants do redis.call('HSET', KEYS[o + i], 'admitted', counts[i] + block) end
    if block > 1 then
      epoch = tonumber(redis.call('GET', KEYS[o + 2 + wants]) or '0')
      local registry = KEYS[o + 1 + wants]
      redis.call('ZREMRANGEBYSCORE', registry, '-inf', ms)
      redis.call('ZADD', registry, ms + tonumber(ARGV[extra + 3]), epoch .. ':' .. ARGV[extra + 2])
      redis.call('PEXPIRE', registry, 2 * tonumber(ARGV[extra + 3]))
    end
  end
end
local result = {allowed and 1 or 0, size, remaining, reset, retry, admitted, block, epoch}
if next_refused then
  for i, h in ipairs(stored) do
    for f = 1, 5 do result[#result + 1] = h[1] and h[f] or '' end
  end
end
return result
"""
LEASE_SCRIPT = RATE_LIMIT_FN + REVOKED_FN + USER_CHANGED_FN + ADMIT_FN + LEASE_BODY

# give_back(KEYS: the registry, n subjects' slots, the admissions' hashes; ARGV: the lease's
# member, its leftovers u, the window start it was taken in, n, then each subject's burst).
# The holder's acknowledgement (the member leaves the registry: a toggle waiting for it goes on)
# and the leftovers returned: u tokens to each bucket, u calls off the window they were counted
# in (if it is still this or the previous minute), u admissions off each count (that still exists).
GIVE_BACK = """
redis.call('ZREM', KEYS[1], ARGV[1])
local u, window, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if u <= 0 then return 0 end
for i = 1, n do
  local key = KEYS[1 + i]
  local h = redis.call('HMGET', key, 'tokens', 'wstart', 'cur', 'prev')
  if h[1] then
    local tokens = math.min(tonumber(ARGV[4 + i]), tonumber(h[1]) + u)
    redis.call('HSET', key, 'tokens', string.format('%.17g', tokens))
    local wstart = tonumber(h[2])
    if wstart == window then
      redis.call('HSET', key, 'cur', string.format('%.17g', math.max(0.0, tonumber(h[3]) - u)))
    elseif wstart == window + 60 then
      redis.call('HSET', key, 'prev', string.format('%.17g', math.max(0.0, tonumber(h[4]) - u)))
    end
  end
end
for i = n + 2, #KEYS do
  local admitted = redis.call('HGET', KEYS[i], 'admitted')
  if admitted then  -- a count Redis lost (evicted, flushed) holds nothing to give back: no key made without its TTL
    redis.call('HSET', KEYS[i], 'admitted', math.max(0, tonumber(admitted) - u))
  end
end
return u
"""
