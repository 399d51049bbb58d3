"""A background task that runs one pass of work every `interval_s` until stopped.

A failed pass is logged and the next one tries again (Postgres or Kafka away, a statement
timeout); `stop()` cancels the task, and with it the statement in flight. Passes that share the
work between replicas take a transaction-scoped advisory try-lock (`postgres.try_xact_lock`):
a replica that does not get it skips that pass.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    """`name` names the task; a failure is logged on `log` as "<what> failed; trying again"."""

    def __init__(
        self, name: str, interval_s: float, work: Callable[[], Awaitable[object]], *, what: str, log: logging.Logger
    ) -> None:
        self._name = name
        self._interval = interval_s
        self._work = work
        self._what = what
        self._log = log
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._work()
            except Exception:
                self._log.warning("%s failed; trying again in %ss", self._what, self._interval, exc_info=True)
