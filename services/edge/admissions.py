"""api_calls admissions shared by every edge replica, in the rate limiter's Redis (`REDIS_URL`).

Each process alone would admit the whole remainder of an account's quota (N replicas: N times
it). Here an account's admissions of the period live in one Redis sorted set (score = admission
time in microseconds), and one Lua script judges and records a call atomically:
1. the newest quota state any replica has brought (its watermark, used, reserved, total) is kept
   beside the set, so a replica whose projection lags judges with the newest one;
2. admissions at or before that state's watermark are dropped (the state has counted them);
3. used + reserved + the admissions left >= total refuses; otherwise the call is added.
So replicas share one count, and the overshoot is what the watermark retires early: calls admitted
before a later-stamped call that quota counted first (see docs/quota.md for the measured bound).

Redis unreachable: the edge falls back, loudly, to its in-process count (Edge.admit_call: a log
line and `tollgate_edge_admission_store_errors_total`); documented in docs/quota.md.
"""

from datetime import datetime
from uuid import uuid4

from redis.asyncio import Redis

from services.edge.quota_gate import CallsView

LUA = """
local now = tonumber(ARGV[1])
local member = ARGV[2]
local has = ARGV[3] == '1'
local w, used, reserved, total = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local kept = redis.call('HMGET', KEYS[2], 'w', 'used', 'reserved', 'total')
if kept[1] and (not has or tonumber(kept[1]) > w) then
  w, used, reserved, total = tonumber(kept[1]), tonumber(kept[2]), tonumber(kept[3]), tonumber(kept[4])
elseif has then
  redis.call('HSET', KEYS[2], 'w', ARGV[4], 'used', ARGV[5], 'reserved', ARGV[6], 'total', ARGV[7])
  redis.call('EXPIRE', KEYS[2], ttl)
end
if w >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', w)
end
local pending = redis.call('ZCARD', KEYS[1])
if used + reserved + pending >= total then
  return {0, pending}
end
redis.call('ZADD', KEYS[1], now, member)
redis.call('EXPIRE', KEYS[1], ttl)
return {1, pending + 1}
"""

# Keys idle this long are dropped: any admission in them was counted long ago.
TTL_S = 2 * 24 * 3600


def micros(moment: datetime) -> int:
    """Microseconds since the epoch: exact in a Lua double (< 2^53), unlike float seconds."""
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


class SharedAdmissions:
    def __init__(self, url: str, prefix: str = "tollgate:adm:") -> None:
        self._redis: Redis[bytes] = Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._prefix = prefix
        self._script = self._redis.register_script(LUA)
        self._replica = uuid4().hex[:12]
        self._seq = 0

    async def admit(self, view: CallsView, now: datetime) -> bool:
        """Admit one call at `now` against the account's shared count; raises when Redis fails."""
        self._seq += 1
        base = f"{self._prefix}{view.account_id}:{view.period}"
        # A state's `time` is stamped by quota from event times: the account's "no state" view
        # (nothing counted this period) says so with has = 0 and keeps any newer state Redis has.
        has = view.watermark is not None
        watermark = micros(view.watermark) if view.watermark is not None else -1
        allowed, _pending = await self._script(
            keys=[f"{base}:a", f"{base}:s"],
            args=[micros(now), f"{self._replica}:{self._seq}", int(has), watermark, view.used, view.reserved, view.total, TTL_S],
        )
        return bool(allowed)

    async def pending(self, view: CallsView) -> int:
        """Admissions of the account not yet counted by the newest state (tests and benchmarks)."""
        return int(await self._redis.zcard(f"{self._prefix}{view.account_id}:{view.period}:a"))

    async def close(self) -> None:
        await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()
