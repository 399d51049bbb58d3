"""The throttles' attempt logs in Redis (REDIS_URL), shared by every replica: one script run per
attempt (throttle_script.py). Its calls raise when Redis fails or is slow; failover_logs.py falls
back to this process's logs then.

Keys: `{TOPIC_PREFIX}tollgate:throttle:{log}:{subject}`, so deployments (and test environments)
sharing one Redis never share counts.
"""

import secrets
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.keys.attempt_logs import Counted, Entry
from services.keys.throttle_script import SCRIPT, US

TIMEOUT_S = 0.5  # a hung Redis costs an attempt this much, once (failover_logs.py)


class RedisLogs:
    def __init__(self, url: str, prefix: str, timeout_s: float = TIMEOUT_S) -> None:
        # No retries: a failed call falls back at once, the next attempt asks again.
        self._redis: Redis[bytes] = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )
        self._script = self._redis.register_script(SCRIPT)
        self._prefix = f"{prefix}tollgate:throttle:"

    def key(self, entry: Entry) -> str:
        log, subject = entry
        return f"{self._prefix}{log.name}:{subject}"

    async def count(self, entries: Sequence[Entry]) -> Counted:
        stamp = secrets.token_hex(8)  # unique among a subject's attempts: what forgive takes back
        args: list[str | int] = [stamp]
        for log, _ in entries:
            args += [log.limit.attempts, round(log.limit.window_s * US)]
        counted, wait = await self._script(keys=[self.key(e) for e in entries], args=args)
        if not counted:
            return Counted(wait=int(wait) / US)
        return Counted(stamp=stamp, shared=True)

    async def forgive(self, entries: Sequence[Entry], counted: Counted) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                pipe.zrem(self.key(entry), counted.stamp)
            await pipe.execute()

    async def clear(self, entries: Sequence[Entry]) -> None:
        await self._redis.delete(*(self.key(e) for e in entries))

    async def close(self) -> None:
        await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()
