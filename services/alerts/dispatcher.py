"""Sends recorded deliveries: lock, send with retries and backoff, record the outcome.

A sender keeps the delivery's row locked (SELECT ... FOR UPDATE SKIP LOCKED) for the whole send,
in an open transaction. Another process or the sweeper skips a locked row, so one message goes
out per delivery; a sender that dies (even by SIGKILL) loses its connection and Postgres frees
the row at once, so the sweeper of any live process resumes it. A round of attempts that all fail
for a passing reason leaves the delivery pending until its next attempt is due (an outage of the
SMTP server or SMS gateway loses no alert), one attempt per call from then on, as a webhook's; one
that fails permanently, or still fails when the window is over, is marked failed (visible in the
rule listing) and is never sent again.

Webhooks (v2), and the Slack and Teams posts (v4) that are webhooks with another body, retry for
hours, too long to hold a lock: each call makes one attempt, and a failed one leaves the delivery
pending with `next_attempt_at`. This process wakes it then; should the process die, the sweeper
of any live one picks it up once it is due. Every attempt of every channel is recorded
(`alerts.delivery_attempts`) for the rule's delivery log.
"""

import asyncio
import json
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
from prometheus_client import Counter
from psycopg_pool import AsyncConnectionPool
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from contracts.alerts_api import URL_CHANNELS, Channel, DeliveryStatus
from contracts.common import METRIC_RESOURCE
from services.alerts import chat, domain, store, webhook
from services.alerts.channels import ChannelSender, DeliveryError, PermanentDeliveryError

log = logging.getLogger(__name__)

FIRED = Counter(
    "tollgate_alerts_fired_total",
    "Deliveries recorded when alert rules fired (a threshold crossed, or a rule created above it), "
    "one per rule and channel (unit: deliveries)",
)
NOTIFICATIONS = Counter(
    "tollgate_alerts_notifications_total",
    "Alert deliveries finished, by channel and outcome: sent, or failed for good (unit: notifications)",
    ["channel", "outcome"],
)
WEBHOOK_ATTEMPTS = Counter(
    "tollgate_alerts_webhook_attempts_total",
    "Webhook delivery attempts (webhook, slack and teams channels), by outcome: delivered, "
    "retry_scheduled (failed, tried again later) "
    "or gave_up (failed after the retry window) (unit: attempts)",
    ["outcome"],
)
for _channel in Channel:  # on /metrics at 0 from the start
    for _outcome in ("sent", "failed"):
        NOTIFICATIONS.labels(_channel.value, _outcome)
for _outcome in ("delivered", "retry_scheduled", "gave_up"):
    WEBHOOK_ATTEMPTS.labels(_outcome)


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
        webhooks: webhook.WebhookSender | None = None,
        webhook_backoff: webhook.Backoff = webhook.DEFAULT_BACKOFF,
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
        self._webhooks = webhooks
        self._webhook_backoff = webhook_backoff
        # Wake-ups of webhook deliveries waiting for their next attempt (not "in flight" for idle()).
        self._timers: set[asyncio.Task[None]] = set()

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Resume deliveries a crashed process left pending, then keep sweeping now and then."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="alerts-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [*self._tasks, *self._timers, *([self._sweeper] if self._sweeper else [])]
        for task in [*self._tasks, *self._timers]:
            task.cancel()  # the open transaction rolls back: the delivery stays pending
        await asyncio.gather(*tasks, return_exceptions=True)

    def fire(self, delivery_ids: Iterable[UUID]) -> None:
        """The deliveries a firing just recorded: counted, then sent."""
        ids = list(delivery_ids)
        FIRED.inc(len(ids))
        self.submit(ids)

    def submit(self, delivery_ids: Iterable[UUID]) -> None:
        for delivery_id in delivery_ids:
            task = asyncio.create_task(self.deliver(delivery_id), name=f"alerts-delivery:{delivery_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _wake_at(self, delivery_id: UUID, due: datetime) -> None:
        async def later() -> None:
            await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 0.01)
            self.submit([delivery_id])

        task = asyncio.create_task(later(), name=f"alerts-retry:{delivery_id}")
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def idle(self) -> None:
        """Wait until no delivery is in flight (tests and the benchmark use it)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ---- sweeping ------------------------------------------------------------------------
    async def sweep(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            ids = await store.pending_ids(conn, datetime.now(UTC))
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
        due: datetime | None = None
        pending: store.PendingDelivery | None = None
        try:
            async with self._slots, self._pool.connection() as conn, conn.transaction():
                pending = await store.lock_pending(conn, delivery_id, datetime.now(UTC))
                if pending is None:
                    return  # sent, failed, not due yet, or being sent by another sender
                if pending.channel in URL_CHANNELS and self._webhooks is not None:
                    status, error, due = await self._attempt_webhook(conn, pending, self._webhooks)
                else:
                    status, attempts, error, due = await self._send(conn, pending)
                    if due is not None:
                        await store.postpone_delivery(conn, delivery_id, error or "", due, attempts)
                    else:
                        await store.finish_delivery(conn, delivery_id, status, attempts, error)
            if due is not None:
                self._wake_at(delivery_id, due)
            if status is not DeliveryStatus.PENDING:
                NOTIFICATIONS.labels(pending.channel.value, status.value).inc()
            if status is DeliveryStatus.FAILED:
                log.warning("alert delivery %s (%s) failed for good: %s", delivery_id, pending.channel.value, error)
        except asyncio.CancelledError:
            raise
        except psycopg.OperationalError:
            # Postgres went away mid-delivery: the row stays pending and the sweeper retries it.
            log.exception("alert delivery %s interrupted; left pending", delivery_id)
        except Exception as exc:
            if pending is None:
                log.exception("alert delivery %s interrupted; left pending", delivery_id)
                return
            # Anything else broke the attempt or its record (the channel, the receiver's answer,
            # the log's write): it would break again. Left as it was, the delivery would be
            # pending and due, taken again at every sweep, for ever; it waits its backoff instead,
            # and fails when its window is over, like any failed attempt.
            log.exception("alert delivery %s broke; postponed", delivery_id)
            await self._postpone_broken(pending, f"the delivery broke: {type(exc).__name__}")

    async def _postpone_broken(self, pending: store.PendingDelivery, error: str) -> None:
        now = datetime.now(UTC)
        backoff = self._webhook_backoff
        due = now + timedelta(seconds=backoff.delay(pending.attempts + 1, random.random()))
        over = due > pending.created_at + timedelta(seconds=backoff.window_seconds)
        try:
            async with self._pool.connection() as conn, conn.transaction():
                if await store.lock_pending(conn, pending.id, now) is None:
                    return  # another sender has it, or it is done
                if over:
                    await store.finish_delivery(conn, pending.id, DeliveryStatus.FAILED, 1, error)
                else:
                    await store.postpone_delivery(conn, pending.id, error, due)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("alert delivery %s could not be postponed; left pending", pending.id)
            return
        if over:
            NOTIFICATIONS.labels(pending.channel.value, DeliveryStatus.FAILED.value).inc()
        else:
            self._wake_at(pending.id, due)

    def _message(self, pending: store.PendingDelivery) -> domain.AlertMessage:
        return domain.AlertMessage(
            metric=pending.metric,
            threshold_pct=pending.threshold_pct,
            used=pending.used,
            total=pending.total,
            period=pending.period,
            links=domain.links_for(self._console_url, METRIC_RESOURCE[pending.metric]),
            key=(
                domain.KeyLimitRef(pending.api_key_id, pending.masked_key, pending.limit_period) if pending.api_key_id else None
            ),
        )

    async def _attempt_webhook(
        self, conn: store.Conn, pending: store.PendingDelivery, sender: webhook.WebhookSender
    ) -> tuple[DeliveryStatus, str | None, datetime | None]:
        """One attempt; a failure within the retry window is postponed, after it is final."""
        number = pending.attempts + 1
        request = self._webhook_request(pending, number)
        now = datetime.now(UTC)
        if request is None:
            result = webhook.AttemptResult(None, "the rule has no webhook secret")
        else:
            result = await sender.attempt(request, now)
        if result.error is None:
            await store.record_attempts(conn, pending.id, [store.Attempt(number, now, result.status_code)])
            await store.finish_delivery(conn, pending.id, DeliveryStatus.SENT, 1, None)
            WEBHOOK_ATTEMPTS.labels("delivered").inc()
            return DeliveryStatus.SENT, None, None
        backoff = self._webhook_backoff
        due = datetime.now(UTC) + timedelta(seconds=backoff.delay(number, random.random()))
        if request is None or due > pending.created_at + timedelta(seconds=backoff.window_seconds):
            await store.record_attempts(conn, pending.id, [store.Attempt(number, now, result.status_code, result.error)])
            await store.finish_delivery(conn, pending.id, DeliveryStatus.FAILED, 1, result.error)
            WEBHOOK_ATTEMPTS.labels("gave_up").inc()
            return DeliveryStatus.FAILED, result.error, None
        await store.record_attempts(conn, pending.id, [store.Attempt(number, now, result.status_code, result.error, due)])
        await store.postpone_delivery(conn, pending.id, result.error, due)
        WEBHOOK_ATTEMPTS.labels("retry_scheduled").inc()
        return DeliveryStatus.PENDING, result.error, due

    def _webhook_request(self, pending: store.PendingDelivery, number: int) -> webhook.WebhookRequest | None:
        """The POST of one attempt: the signed Tollgate alert, or the Slack or Teams message
        (unsigned: neither platform checks a signature). None: a webhook rule without a secret."""
        url = domain.address_of(pending.recipient)
        message = self._message(pending)
        if pending.channel is Channel.WEBHOOK:
            if pending.webhook_secret is None:
                return None
            body = webhook.payload(pending.id, pending.rule_id, pending.account_id, pending.fired_at, message)
            return webhook.WebhookRequest(url, pending.webhook_secret, pending.id, number, body)
        chat_body = json.dumps(chat.chat_message(pending.channel, message, pending.id), separators=(",", ":")).encode()
        ok_body = chat.SLACK_OK_BODY if pending.channel is Channel.SLACK else None
        return webhook.WebhookRequest(url, None, pending.id, number, chat_body, https_only=True, ok_body=ok_body)

    async def _send(
        self, conn: store.Conn, pending: store.PendingDelivery
    ) -> tuple[DeliveryStatus, int, str | None, datetime | None]:
        """A round of attempts with the row locked. Transient failures to the end of the round (an
        SMTP server or SMS gateway down for longer than its seconds) leave the delivery pending
        until the next round is due (the webhooks' backoff and window, returned as the last item),
        so an outage loses no alert; after the window, or on a permanent error, it fails. Only the
        first call is a round: later ones make one attempt each."""
        sender = self._senders.get(pending.channel)
        if sender is None:
            return DeliveryStatus.FAILED, 0, f"channel {pending.channel.value} is not available", None
        message = self._message(pending)
        attempts = 0
        # The attempt log, written with the outcome; a failed attempt learns when the next is due
        # from tenacity's decision to sleep.
        log_rows: list[store.Attempt] = []

        def note_sleep(state: RetryCallState) -> None:
            if log_rows:
                last = log_rows[-1]
                log_rows[-1] = replace(last, next_attempt_at=datetime.now(UTC) + timedelta(seconds=state.upcoming_sleep))

        # The first round tries a few times within seconds (a blip), the row locked and a slot of
        # the dispatcher's taken meanwhile. A delivery that had its round makes one attempt per
        # call, as a webhook does: an SMTP server or SMS gateway down for hours then costs each of
        # its pending deliveries one attempt per backoff step, not a round of sleeps holding one of
        # the slots every account's alerts (in-site, webhooks) share, again and again for 24 h.
        first_round = pending.attempts == 0
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._retry.attempts if first_round else 1),
            wait=wait_exponential(multiplier=self._retry.initial_seconds, max=self._retry.max_seconds)
            + wait_random(0, self._retry.initial_seconds / 2),
            retry=retry_if_exception_type(DeliveryError) & retry_if_not_exception_type(PermanentDeliveryError),
            reraise=False,
            before_sleep=note_sleep,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    started = datetime.now(UTC)
                    try:
                        # A savepoint per attempt: a failed in-site insert must not poison the lock's transaction.
                        async with conn.transaction():
                            await sender.send(conn, pending, message)
                    except DeliveryError as exc:
                        log_rows.append(store.Attempt(pending.attempts + attempts, started, error=str(exc)[:1000]))
                        raise
                    log_rows.append(store.Attempt(pending.attempts + attempts, started))
        except RetryError as exc:
            error = str(exc.last_attempt.exception())[:1000]
            backoff = self._webhook_backoff
            # the n-th failed call (the round, then each single attempt) waits the n-th delay
            failed_calls = 1 if first_round else 2 + max(0, pending.attempts - self._retry.attempts)
            due = datetime.now(UTC) + timedelta(seconds=backoff.delay(failed_calls, random.random()))
            if due > pending.created_at + timedelta(seconds=backoff.window_seconds):  # the window is over
                await store.record_attempts(conn, pending.id, log_rows)
                return DeliveryStatus.FAILED, attempts, error, None
            log_rows[-1] = replace(log_rows[-1], next_attempt_at=due)
            await store.record_attempts(conn, pending.id, log_rows)
            return DeliveryStatus.PENDING, attempts, error, due
        except DeliveryError as exc:  # permanent: not retried
            await store.record_attempts(conn, pending.id, log_rows)
            return DeliveryStatus.FAILED, attempts, str(exc)[:1000], None
        await store.record_attempts(conn, pending.id, log_rows)
        return DeliveryStatus.SENT, attempts, None, None
