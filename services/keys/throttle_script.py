"""The throttles' Lua (redis_logs.RedisLogs): one atomic check-and-count of an attempt in each of its
logs, on Redis's own clock.

A log is a sorted set per subject: member an attempt's stamp, score its time in microseconds by
Redis TIME (one clock for every replica). The same rule as throttle.SlidingLog: times that have
left the window are dropped; a subject whose `attempts`-th most recent time lies within the window
waits until it leaves; an attempt no log refuses is counted in all of them, each log kept to its
last `attempts` times and expiring a window after its newest, so an idle subject leaves nothing
behind.

KEYS: the subjects' sorted sets. ARGV: the attempt's stamp, then per key its attempts and window
(microseconds). Returns {1, 0} when counted, {0, wait in microseconds} when refused. Writes after
TIME need Redis 5 or later (scripts replicated by their effects).
"""

SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait = 0
for i, key in ipairs(KEYS) do
  local attempts, window = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local n = redis.call('ZCARD', key)
  if n >= attempts then
    local oldest = redis.call('ZRANGE', key, n - attempts, n - attempts, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now)
  end
end
if wait > 0 then
  return {0, wait}
end
for i, key in ipairs(KEYS) do
  local attempts, window = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('ZADD', key, now, ARGV[1])
  redis.call('ZREMRANGEBYRANK', key, 0, -attempts - 1)
  redis.call('PEXPIRE', key, math.ceil(window / 1000))
end
return {1, 0}
"""

US = 1_000_000  # the script's times are in microseconds
