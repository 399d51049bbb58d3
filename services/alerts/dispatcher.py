"""Sends recorded deliveries: lock, send with retries and backoff, record the outcome.

A sender keeps the delivery's row locked (SELECT ... FOR UPDATE SKIP LOCKED) for the whole send,
in an open transaction. Another process or the sweeper skips a locked row, so one message goes
out per delivery; a sender that dies (even by SIGKILL) loses its connection and Postgres frees
the row at once, so the sweeper of any live process resumes it. A delivery whose attempts are
exhausted is marked failed (visible in the rule listing) and is never sent again.
"""

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from uuid import UUID

from psycopg_pool import AsyncConnectionPool
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from contracts.alerts_api import Channel, DeliveryStatus
from contracts.common import METRIC_RESOURCE
from services.alerts import domain, store
from services.alerts.channels import ChannelSender, DeliveryError, PermanentDeliveryError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    initial_seconds: float = 0.5
    max_seconds: float = 8.0


class Dispatcher:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        senders: Iterable[ChannelSender],
        console_url: str,
        *,
        retry: RetryPolicy = RetryPolicy(),
        concurrency: int = 4,
        sweep_interval: float = 15.0,
    ) -> None:
        self._pool = pool
        self._senders: Mapping[Channel, ChannelSender] = {s.channel: s for s in senders}
        self._console_url = console_url
        self._retry = retry
        # Each send in flight holds a pooled connection; bound them so the pool serves the rest.
        self._slots = asyncio.Semaphore(concurrency)
        self._sweep_interval = sweep_interval
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Resume deliveries a crashed process left pending, then keep sweeping now and then."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="alerts-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [*self._tasks, *([self._sweeper] if self._sweeper else [])]
        for task in self._tasks:
            task.cancel()  # the open transaction rolls back: the delivery stays pending
        await asyncio.gather(*tasks, return_exceptions=True)

    def submit(self, delivery_ids: Iterable[UUID]) -> None:
        for delivery_id in delivery_ids:
            task = asyncio.create_task(self.deliver(delivery_id), name=f"alerts-delivery:{delivery_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Wait until no delivery is in flight (tests and the benchmark use it)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ---- sweeping ------------------------------------------------------------------------
    async def sweep(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            ids = await store.pending_ids(conn)
        # Submitted outside that transaction: each deliver() takes its own lock (and skips the
        # rows another sender holds, so a sweep racing a fresh firing sends nothing twice).
        self.submit(ids)
        return len(ids)

    async def _sweep_forever(self) -> None:
        while True:
            try:
                found = await self.sweep()
                if found:
                    log.info("alerts sweeper resumed %d pending deliveries", found)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("alerts sweep failed; trying again later")
            await asyncio.sleep(self._sweep_interval)

    # ---- one delivery --------------------------------------------------------------------
    async def deliver(self, delivery_id: UUID) -> None:
        try:
            async with self._slots, self._pool.connection() as conn, conn.transaction():
                pending = await store.lock_pending(conn, delivery_id)
                if pending is None:
                    return  # sent, failed, or being sent by another sender
                status, attempts, error = await self._send(conn, pending)
                await store.finish_delivery(conn, delivery_id, status, attempts, error)
            if status is DeliveryStatus.FAILED:
                log.warning("alert delivery %s (%s) failed for good: %s", delivery_id, pending.channel.value, error)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Postgres went away mid-delivery: the row stays pending and the sweeper retries it.
            log.exception("alert delivery %s interrupted; left pending", delivery_id)

    async def _send(self, conn: store.Conn, pending: store.PendingDelivery) -> tuple[DeliveryStatus, int, str | None]:
        sender = self._senders.get(pending.channel)
        if sender is None:
            return DeliveryStatus.FAILED, 0, f"channel {pending.channel.value} is not available"
        message = domain.AlertMessage(
            metric=pending.metric,
            threshold_pct=pending.threshold_pct,
            used=pending.used,
            total=pending.total,
            period=pending.period,
            links=domain.links_for(self._console_url, METRIC_RESOURCE[pending.metric]),
        )
        attempts = 0
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._retry.attempts),
            wait=wait_exponential(multiplier=self._retry.initial_seconds, max=self._retry.max_seconds)
            + wait_random(0, self._retry.initial_seconds / 2),
            retry=retry_if_exception_type(DeliveryError) & retry_if_not_exception_type(PermanentDeliveryError),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    # A savepoint per attempt: a failed in-site insert must not poison the lock's transaction.
                    async with conn.transaction():
                        await sender.send(conn, pending, message)
        except RetryError as exc:
            return DeliveryStatus.FAILED, attempts, str(exc.last_attempt.exception())[:1000]
        except DeliveryError as exc:  # permanent: not retried
            return DeliveryStatus.FAILED, attempts, str(exc)[:1000]
        return DeliveryStatus.SENT, attempts, None
