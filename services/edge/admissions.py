"""api_calls admissions shared by every edge replica, in the rate limiter's Redis (`REDIS_URL`).

Each process alone would admit the whole remainder of an account's quota (N replicas: N times
it). Here an account's admissions of the period are one counter in Redis, beside the newest
quota state any replica has brought (watermark, used, reserved, total), and one Lua script
judges and records a call atomically:
1. a replica whose projection lags is judged by the newest state Redis keeps (by watermark);
2. admitted := max(admitted, used): calls quota counted without passing here (Redis was away,
   or its key was lost) take their places too;
3. admitted + reserved >= total refuses; otherwise admitted += 1.
Every call quota counts was admitted here first, so `admitted` is quota's count plus the calls
still in flight, whatever order their events arrive in: the replicas together admit exactly the
total. An admitted call that ends refused (a 401/403/429 of its handler) is not counted by quota,
so its admission is given back (`release_soon`). A replica that dies between admitting a call and
sending its event holds that place for the rest of the period: it errs towards refusing early,
never towards admitting more than was paid for (docs/quota.md).

Redis unreachable: the edge falls back, loudly, to its in-process count (Edge.admit_call: a log
line and `tollgate_edge_admission_store_errors_total`); documented in docs/quota.md.
"""

import asyncio
import logging
import time
from datetime import datetime

from prometheus_client import Counter
from redis.asyncio import Redis

from services.edge.quota_gate import CallsView

log = logging.getLogger(__name__)
ADMISSION_STORE_ERRORS = Counter(
    "tollgate_edge_admission_store_errors_total",
    "Shared api_calls admissions that failed in Redis (judged by this process's own count, or not given back)",
)

ADMIT = """
local has = ARGV[1] == '1'
local w, used, reserved, total = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local kept = redis.call('HMGET', KEYS[1], 'w', 'used', 'reserved', 'total', 'admitted')
if kept[1] and (not has or tonumber(kept[1]) > w) then
  used, reserved, total = tonumber(kept[2]), tonumber(kept[3]), tonumber(kept[4])
elseif has then
  redis.call('HSET', KEYS[1], 'w', ARGV[2], 'used', ARGV[3], 'reserved', ARGV[4], 'total', ARGV[5])
end
local admitted = math.max(tonumber(kept[5] or '0'), used)
local allowed = admitted + reserved < total
if allowed then
  admitted = admitted + 1
end
redis.call('HSET', KEYS[1], 'admitted', admitted)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
return {allowed and 1 or 0, admitted}
"""

RELEASE = """
local admitted = tonumber(redis.call('HGET', KEYS[1], 'admitted') or '0')
if admitted > 0 then
  redis.call('HSET', KEYS[1], 'admitted', admitted - 1)
end
return admitted
"""

# Keys idle this long are dropped: any admission in them was counted long ago.
TTL_S = 2 * 24 * 3600
WARN_EVERY_S = 10.0


def micros(moment: datetime) -> int:
    """Microseconds since the epoch: exact in a Lua double (< 2^53), unlike float seconds."""
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


class SharedAdmissions:
    def __init__(self, url: str, prefix: str = "tollgate:adm:") -> None:
        self._redis: Redis[bytes] = Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._prefix = prefix
        self._admit = self._redis.register_script(ADMIT)
        self._release = self._redis.register_script(RELEASE)
        self._releases: set[asyncio.Task[None]] = set()
        self._warned = 0.0

    def _key(self, view: CallsView) -> str:
        return f"{self._prefix}{view.account_id}:{view.period}"

    async def admit(self, view: CallsView) -> bool:
        """Admit one call of `view`'s account and period against the shared count; raises when
        Redis fails. `view` is this process's projection: the newest state Redis keeps wins."""
        # A state's `time` is stamped by quota from event times: the account's "no state" view
        # (nothing counted this period) says so with has = 0 and keeps any newer state Redis has.
        has = view.watermark is not None
        watermark = micros(view.watermark) if view.watermark is not None else -1
        allowed, _admitted = await self._admit(
            keys=[self._key(view)], args=[int(has), watermark, view.used, view.reserved, view.total, TTL_S]
        )
        return bool(allowed)

    async def release(self, view: CallsView) -> None:
        """Give back one admission of `view`'s account and period: its call ended refused, so
        quota will not count it. Raises when Redis fails."""
        await self._release(keys=[self._key(view)])

    def release_soon(self, view: CallsView) -> None:
        """`release` in the background (after the response); a failure keeps the place taken
        (the account is refused one call early), counted and logged."""
        task = asyncio.get_running_loop().create_task(self._release_logged(view))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release_logged(self, view: CallsView) -> None:
        try:
            await self.release(view)
        except Exception:
            ADMISSION_STORE_ERRORS.inc()
            if time.monotonic() - self._warned > WARN_EVERY_S:
                self._warned = time.monotonic()
                log.warning("an api_calls admission could not be given back (Redis): its place stays taken", exc_info=True)

    async def admitted(self, view: CallsView) -> int:
        """The account's admissions of the period: counted by quota or in flight (tests, benchmarks)."""
        return int(await self._redis.hget(self._key(view), "admitted") or 0)

    async def close(self) -> None:
        if self._releases:
            await asyncio.gather(*self._releases)
        await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()
