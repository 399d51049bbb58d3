"""The rate limiter's Lua (rate_store.RedisStore): run atomically on Redis, one round trip a call,
and the KEYS and ARGV a call passes it (`ScriptKeys`).

Redis keeps the doubles as `%.17g` strings, which round-trip exactly, so the Redis store decides
as rate_limit.evaluate does in process.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.edge.admissions import ADMIT_FN, admission_args, admission_key
from services.edge.key_revocations import KeyCheck
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import WINDOW_S, Limits
from services.edge.user_revocations import USER_CHANGED_FN

# The same arithmetic as rate_limit.py, statement for statement (keep them in step).
# rate_limit(keys, now, limits, ttl, take) -> allowed; the headers' limit, remaining, reset and retry
# (the binding limit's, as rate_limit.evaluate); the slots as stored after the call (HMGET-like
# rows); whether a request at the same time would be refused. limits[i] = {rate, burst, limit} of
# keys[i]. `take` false is a peek (evaluate's take=False): nothing written, the room left now.
RATE_LIMIT_FN = """
local function rate_limit(keys, now, limits, ttl, take)
  local W = 60.0
  local wnow = math.floor(now / W) * W
  local slots = {}
  local function estimate(s)
    return s.prev * math.max(0.0, (W - math.max(0.0, now - s.wstart)) / W) + s.cur
  end
  local stored = {}
  for i, key in ipairs(keys) do
    local rate, burst = limits[i][1], limits[i][2]
    local h = redis.call('HMGET', key, 'tokens', 'updated', 'wstart', 'cur', 'prev')
    stored[i] = h
    local s
    if not h[1] then
      s = {tokens = burst, updated = now, wstart = wnow, cur = 0.0, prev = 0.0}
    else
      s = {tokens = tonumber(h[1]), updated = tonumber(h[2]), wstart = tonumber(h[3]),
           cur = tonumber(h[4]), prev = tonumber(h[5])}
      s.tokens = math.min(burst, s.tokens + math.max(0.0, now - s.updated) * rate)
      s.updated = math.max(now, s.updated)
      if wnow == s.wstart then
      elseif wnow == s.wstart + W then
        s.prev = s.cur; s.cur = 0.0; s.wstart = wnow
      elseif wnow > s.wstart then
        s.prev = 0.0; s.cur = 0.0; s.wstart = wnow
      end
    end
    slots[i] = s
  end
  -- The limits that refuse a request now: {retry, reset, size} (rate_limit._refusing), and of
  -- them the one the headers describe: the longest Retry-After, then Reset, then size.
  local allowed, retry, reset, size = true, 0, 0, 0
  local function refusing(wait, full, of)
    local r, f = math.max(1, math.ceil(wait)), math.ceil(full)
    if allowed or r > retry or (r == retry and (f > reset or (f == reset and of > size))) then
      retry, reset, size = r, f, of
    end
    allowed = false
  end
  local function window_reset(s)
    if s.cur > 0 then return math.max(0.0, s.wstart + 2 * W - now) end
    if s.prev > 0 then return math.max(0.0, s.wstart + W - now) end
    return 0.0
  end
  for i, s in ipairs(slots) do
    local rate, burst, limit = limits[i][1], limits[i][2], limits[i][3]
    if s.tokens < 1.0 then
      refusing((1.0 - s.tokens) / rate, math.max(0.0, (burst - s.tokens) / rate), burst)
    end
    local est = estimate(s)
    if est + 1.0 > limit then
      local elapsed = math.max(0.0, now - s.wstart)
      local ww
      if s.cur + 1.0 <= limit and s.prev > 0 then
        ww = math.max(0.0, W - elapsed - W * (limit - s.cur - 1.0) / s.prev)
      else
        ww = s.wstart + W - now
        if s.cur > 0 then ww = ww + math.max(0.0, W - W * (limit - 1.0) / s.cur) end
        ww = math.max(0.0, ww)
      end
      refusing(ww, window_reset(s), limit)
    end
  end
  local remaining = 0
  if allowed then
    -- The tightest limit after the call: the least room, then the longest Reset, then the smaller.
    local first = true
    local function room(r, f, of)
      if first or r < remaining or (r == remaining and (f > reset or (f == reset and of < size))) then
        remaining, reset, size = r, f, of
      end
      first = false
    end
    for i, s in ipairs(slots) do
      local rate, burst, limit = limits[i][1], limits[i][2], limits[i][3]
      if take then
        s.tokens = s.tokens - 1.0
        s.cur = s.cur + 1.0
        stored[i] = {string.format('%.17g', s.tokens), string.format('%.17g', s.updated),
          string.format('%.17g', s.wstart), string.format('%.17g', s.cur), string.format('%.17g', s.prev)}
        redis.call('HSET', keys[i], 'tokens', stored[i][1], 'updated', stored[i][2], 'wstart', stored[i][3],
          'cur', stored[i][4], 'prev', stored[i][5])
        redis.call('EXPIRE', keys[i], ttl)
      end
      room(math.floor(s.tokens), math.ceil(math.max(0.0, (burst - s.tokens) / rate)), burst)
      room(math.floor(limit - estimate(s)), math.ceil(window_reset(s)), limit)
    end
  else
    reset = math.max(reset, retry)
  end
  local next_refused = not allowed
  for i, s in ipairs(slots) do
    if s.tokens < 1.0 or estimate(s) + 1.0 > limits[i][3] then next_refused = true end
  end
  return allowed, size, math.max(0, remaining), reset, retry, stored, next_refused
end
"""
# revoked_after(entry, known): how the key was revoked ('deleted' | 'disabled' | 'narrowed') when
# its revocation entry (key_revocations) was written at a later version than `known`, else nil.
REVOKED_FN = """
local function revoked_after(entry, known)
  local revoked = redis.call('GET', entry)
  if revoked then
    local version, how = string.match(revoked, '^(%d+) (%a+)$')
    if version and tonumber(version) > known then
      return how
    end
  end
  return nil
end
"""
# KEYS: the rate limit's subjects, then (when ARGV[4] >= 0) the key's revocation entry and (when
# the user's version, ARGV[7 + 3n + 6 * wants], is >= -1) its user's entry, then the ARGV[3]
# admissions' hashes. ARGV[1..2]: now, ttl; ARGV[4]: the version of the key's state the caller
# judged it by (-1: no check); ARGV[5]: n, the number of subjects; ARGV[6]: 1 to take, 0 for a peek
# (v4: writes nothing, and asks no admission); then each subject's rate, burst, limit (3n values);
# then 6 per admission (admissions.admission_args); then the version of the users.v1 state of the
# user the key acts as that the caller judged it by (-1: none known; -2: not asked). Returns
# {-1, 'deleted' | 'disabled' | 'narrowed' | 'removed' | 'role'} when the key was revoked (v4: or
# given new rules), or its user removed or given another role, at a later version (nothing is
# taken), else {allowed, limit, remaining, reset, retry (the headers'), admitted (0: every
# admission taken; i: the i-th had no room, none taken; -1 not judged), and when the subjects'
# next request would be refused, their slots as stored...}.
SCRIPT = (
    RATE_LIMIT_FN
    + REVOKED_FN
    + USER_CHANGED_FN
    + ADMIT_FN
    + """
local wants = tonumber(ARGV[3])
local known = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local take = ARGV[6] == '1'
local limits = {}
for i = 1, n do
  limits[i] = {tonumber(ARGV[4 + 3 * i]), tonumber(ARGV[5 + 3 * i]), tonumber(ARGV[6 + 3 * i])}
end
local before_admissions = #KEYS - wants
if known >= 0 then
  local how = revoked_after(KEYS[n + 1], known)
  if how then
    return {-1, how}
  end
  local user_known = tonumber(ARGV[7 + 3 * n + 6 * wants])
  if user_known >= -1 then
    how = user_changed(KEYS[n + 2], user_known)
    if how then
      return {-1, how}
    end
  end
end
local subjects = {}
for i = 1, n do subjects[i] = KEYS[i] end
local allowed, size, remaining, reset, retry, stored, next_refused = rate_limit(
  subjects, tonumber(ARGV[1]), limits, tonumber(ARGV[2]), take)
local admitted = -1
if allowed and take and wants > 0 then
  admitted = 0
  local counts = {}
  for i = 1, wants do
    local count, fits = room(KEYS[before_admissions + i], ARGV, 7 + 3 * n + (i - 1) * 6)
    counts[i] = count
    if not fits and admitted == 0 then admitted = i end
  end
  if admitted == 0 then
    for i = 1, wants do redis.call('HSET', KEYS[before_admissions + i], 'admitted', counts[i] + 1) end
  end
end
local result = {allowed and 1 or 0, size, remaining, reset, retry, admitted}
if next_refused then
  -- the slots as stored after this call (a refusal or a peek writes nothing), for the caller's copy
  for i, h in ipairs(stored) do
    for f = 1, 5 do result[#result + 1] = h[1] and h[f] or '' end
  end
end
return result
"""
)


@dataclass(frozen=True, slots=True)
class ScriptKeys:
    """Where SCRIPT's Redis keys live, and so its KEYS and ARGV for a call."""

    prefix: str  # the subjects' slots (and, under it, the leases' registry, epoch and replicas)
    admissions_prefix: str
    revoked_prefix: str
    users_prefix: str = "tollgate:user:"  # user_revocations.py: a user's entry

    @staticmethod
    def entries(known: KeyCheck | None) -> int:
        """How many KEYS sit between the subjects and the admissions: the key's revocation entry,
        and its user's when the user is asked."""
        if known is None:
            return 0
        return 2 if known.user_id is not None else 1

    def call(
        self,
        subjects: tuple[str, ...],
        per: Sequence[Limits],
        now: float,
        admission: tuple[CallsView, ...] | None,
        known: KeyCheck | None,
        *,
        take: bool,
    ) -> tuple[list[str], list[str | int]]:
        """SCRIPT's KEYS and ARGV; LEASE_SCRIPT's begin with the same."""
        # Idle slots expire once a full bucket and an empty window would be the same thing.
        ttl = int(2 * WINDOW_S + max(math.ceil(lim.burst / lim.per_second) for lim in per))
        keys = [self.prefix + s for s in subjects]
        args: list[str | int] = [repr(now), ttl, 0 if admission is None else len(admission)]
        args += [-1 if known is None else known.version, len(per), 1 if take else 0]
        for lim in per:
            args += [repr(lim.per_second), lim.burst, lim.per_minute]
        if known is not None:
            keys.append(self.revoked_prefix + str(known.key_id))
            if known.user_id is not None:
                keys.append(self.users_prefix + str(known.user_id))
        for view in admission or ():
            keys.append(admission_key(self.admissions_prefix, view))
            args += admission_args(view)
        args.append(known.user_version if known is not None and known.user_id is not None else -2)
        return keys, args
