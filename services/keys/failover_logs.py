"""The throttles' store with REDIS_URL: the shared logs in Redis (redis_logs.py) while Redis answers
within its timeout, this process's logs (attempt_logs.LocalLogs) while it does not.

A throttle is no reason to refuse logins or to hang them: when Redis fails, attempts are judged and
counted by this process alone (each replica then allows the limit: the bound of a process without
Redis) and the outage is logged once, when it starts, and once when Redis answers again, which is
asked again `RETRY_S` after the last failure (not on every attempt: a hung Redis would cost each
one the timeout). An attempt is forgiven in the store that counted it.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from services.keys.attempt_logs import AttemptLogs, Counted, Entry, LocalLogs
from services.keys.redis_logs import TIMEOUT_S, RedisLogs
from services.runtime.platform.metrics import DEPENDENCY_ERRORS
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

RETRY_S = 5.0


class FailoverLogs:
    def __init__(
        self,
        shared: AttemptLogs,
        local: LocalLogs,
        *,
        timeout_s: float = TIMEOUT_S,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shared, self._local = shared, local
        self._timeout_s, self._retry_s, self._clock = timeout_s, retry_s, clock
        self._failed_at: float | None = None  # the last failure of an outage; None: Redis answers

    async def count(self, entries: Sequence[Entry]) -> Counted:
        if self._asking():
            try:
                async with asyncio.timeout(self._timeout_s):
                    counted = await self._shared.count(entries)
            except Exception:
                self._failed()
            else:
                self._answered()
                return counted
        return await self._local.count(entries)

    async def forgive(self, entries: Sequence[Entry], counted: Counted) -> None:
        if not counted.shared:
            await self._local.forgive(entries, counted)
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._shared.forgive(entries, counted)
        except Exception:  # the attempt stays counted until it leaves the window
            self._failed()
        else:
            self._answered()

    async def clear(self, entries: Sequence[Entry]) -> None:
        await self._local.clear(entries)  # attempts counted here during an outage
        if self._asking():
            try:
                async with asyncio.timeout(self._timeout_s):
                    await self._shared.clear(entries)
            except Exception:
                self._failed()
            else:
                self._answered()

    async def close(self) -> None:
        await self._shared.close()

    def _asking(self) -> bool:
        return self._failed_at is None or self._clock() - self._failed_at >= self._retry_s

    def _failed(self) -> None:
        DEPENDENCY_ERRORS.labels("redis").inc()
        if self._failed_at is None:
            log.warning("the throttles' Redis failed; throttling in this process alone until it answers", exc_info=True)
        self._failed_at = self._clock()

    def _answered(self) -> None:
        if self._failed_at is not None:
            log.warning("the throttles' Redis answers again; throttles are shared again")
            self._failed_at = None


def attempt_logs(settings: Settings) -> AttemptLogs:
    """Redis's shared logs with this process's as the fallback (REDIS_URL set), else this process's."""
    if not settings.redis_url:
        return LocalLogs()
    return FailoverLogs(RedisLogs(settings.redis_url, settings.topic_prefix), LocalLogs())
