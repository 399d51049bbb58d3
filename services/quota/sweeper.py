"""Releases reservations at their expiry: a background task runs QuotaService.expire every
`interval_s` (one replica at a time does the work; see QuotaService.expire). A failed pass is
logged and the next one tries again. Expired reservations stop counting at their expiry even
before a pass (quota reads only unexpired ones); the pass publishes the freed states."""

import asyncio
import logging

from services.quota.service import QuotaService

log = logging.getLogger(__name__)


class ReservationSweeper:
    def __init__(self, service: QuotaService, interval_s: float = 1.0) -> None:
        self._service = service
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="quota:reservation-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                while await self._service.expire() > 0:
                    pass  # more than one chunk expired: go on at once
            except Exception:  # Postgres or Kafka away: the reservations wait for the next pass
                log.warning("expiring reservations failed; trying again in %ss", self._interval, exc_info=True)
