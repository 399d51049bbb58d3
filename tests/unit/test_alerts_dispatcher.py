"""The dispatcher's outcome of a round of e-mail or SMS attempts, with its store calls faked: an
outage longer than the round (an SMTP server or SMS gateway down for a minute) postpones the
delivery with backoff instead of losing the alert; only the end of the window or a permanent
error fails it. (The same against real Postgres, SMTP and a gateway: test_alerts_delivery.py.)"""

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import aiosmtplib
import psycopg
import pytest

from contracts.alerts_api import Channel
from contracts.common import AlertMetric
from services.alerts import dispatcher as dispatcher_module
from services.alerts import store
from services.alerts.channels import DeliveryError, EmailChannel, PermanentDeliveryError
from services.alerts.dispatcher import Dispatcher, RetryPolicy
from services.alerts.webhook import Backoff
from services.runtime.platform.settings import Settings

FAST = RetryPolicy(attempts=3, initial_seconds=0.001, max_seconds=0.002)


class _Conn:
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        yield


class _Pool:
    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_Conn]:
        yield _Conn()


class _Down:
    """An e-mail channel whose server is down for the first `failures` sends."""

    channel = Channel.EMAIL

    def __init__(self, failures: int, permanent: bool = False) -> None:
        self.failures, self.permanent, self.sent = failures, permanent, 0

    async def send(self, conn: Any, delivery: store.PendingDelivery, message: Any) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise (PermanentDeliveryError if self.permanent else DeliveryError)("smtp: connection refused")
        self.sent += 1


class _Rows:
    """alerts.deliveries' one row, as the store functions the dispatcher calls see it."""

    def __init__(self, created_at: datetime) -> None:
        self.status, self.attempts, self.next_attempt_at, self.error = "pending", 0, None, None
        self.created_at = created_at
        self.log: list[store.Attempt] = []
        self.recipient = "email:ops@example.com"

    async def lock_pending(self, conn: Any, delivery_id: uuid.UUID, now: datetime) -> store.PendingDelivery | None:
        if self.status != "pending" or (self.next_attempt_at is not None and self.next_attempt_at > now):
            return None
        return store.PendingDelivery(
            delivery_id, uuid.uuid4(), Channel.EMAIL, self.recipient, self.attempts,
            AlertMetric.API_CALLS, 90, "2026-11", 950, 1000, uuid.uuid4(), self.created_at, self.created_at,
        )  # fmt: skip

    async def finish_delivery(self, conn: Any, delivery_id: uuid.UUID, status: Any, attempts: int, error: str | None) -> None:
        self.status, self.attempts, self.error, self.next_attempt_at = status.value, self.attempts + attempts, error, None

    async def postpone_delivery(self, conn: Any, delivery_id: uuid.UUID, error: str, due: datetime, attempts: int = 1) -> None:
        self.attempts, self.error, self.next_attempt_at = self.attempts + attempts, error, due

    async def record_attempts(self, conn: Any, delivery_id: uuid.UUID, attempts: list[store.Attempt]) -> None:
        self.log += attempts


@pytest.fixture
def rows(monkeypatch: pytest.MonkeyPatch) -> _Rows:
    fake = _Rows(datetime.now(UTC))
    for name in ("lock_pending", "finish_delivery", "postpone_delivery", "record_attempts"):
        monkeypatch.setattr(dispatcher_module.store, name, getattr(fake, name))
    return fake


async def test_an_smtp_outage_longer_than_a_round_postpones_the_delivery_and_it_is_sent_when_the_server_is_back(rows):
    channel = _Down(failures=4)  # a round of 3 attempts fails, the next round's second succeeds
    dispatcher = Dispatcher(_Pool(), [channel], "https://console", retry=FAST, webhook_backoff=Backoff(30, 3600, 86400))  # type: ignore[arg-type]
    delivery_id = uuid.uuid4()
    await dispatcher.deliver(delivery_id)
    assert (rows.status, rows.attempts) == ("pending", 3)  # not failed: the alert is not lost
    due = rows.next_attempt_at
    assert due is not None and timedelta(seconds=29) < due - datetime.now(UTC) <= timedelta(seconds=34)  # no hot loop
    assert rows.log[-1].next_attempt_at == due and "refused" in (rows.error or "")
    await dispatcher.deliver(delivery_id)  # a sweep before it is due sends nothing
    assert channel.sent == 0 and rows.attempts == 3
    rows.next_attempt_at = datetime.now(UTC)  # due now: one attempt (the round was the first call's)
    await dispatcher.deliver(delivery_id)
    assert (rows.status, rows.attempts, channel.sent) == ("pending", 4, 0)
    due = rows.next_attempt_at
    assert due is not None and timedelta(seconds=59) < due - datetime.now(UTC) <= timedelta(seconds=67)  # the next step
    rows.next_attempt_at = datetime.now(UTC)
    await dispatcher.deliver(delivery_id)
    assert (rows.status, rows.attempts, channel.sent) == ("sent", 5, 1)
    await dispatcher.stop()


async def test_after_its_first_round_a_delivery_makes_one_attempt_per_call_holding_no_slot_through_sleeps(rows):
    """(review) An outage of hours made every pending e-mail or SMS delivery run a whole round at
    each backoff step for 24 h: its sleeps (and up to five connect timeouts) with the row locked and
    one of the dispatcher's slots taken, the slots every account's in-site and webhook alerts share.
    After the first round, each call is one attempt, as a webhook's (no sleep), at the next step."""
    channel = _Down(failures=99)
    dispatcher = Dispatcher(_Pool(), [channel], "https://console", retry=FAST, webhook_backoff=Backoff(30, 3600, 86400))  # type: ignore[arg-type]
    delivery_id = uuid.uuid4()
    await dispatcher.deliver(delivery_id)  # the first round: 3 attempts
    assert rows.attempts == 3
    for calls, delay in ((1, 60), (2, 120), (3, 240)):
        rows.next_attempt_at = datetime.now(UTC)
        await dispatcher.deliver(delivery_id)
        assert (rows.status, rows.attempts, len(rows.log)) == ("pending", 3 + calls, 3 + calls)
        due = rows.next_attempt_at
        assert due is not None and delay - 1 < (due - datetime.now(UTC)).total_seconds() <= delay * 1.1
        assert rows.log[-1].number == 3 + calls and rows.log[-1].next_attempt_at == due
    await dispatcher.stop()


async def test_after_the_window_or_on_a_permanent_error_the_delivery_fails_for_good(rows):
    dispatcher = Dispatcher(_Pool(), [_Down(failures=99)], "https://console", retry=FAST, webhook_backoff=Backoff(30, 3600, 10))  # type: ignore[arg-type]
    await dispatcher.deliver(uuid.uuid4())
    assert (rows.status, rows.attempts, rows.next_attempt_at) == ("failed", 3, None)
    rows.status, rows.attempts = "pending", 0
    refused = Dispatcher(_Pool(), [_Down(failures=1, permanent=True)], "https://console", retry=FAST)  # type: ignore[arg-type]
    await refused.deliver(uuid.uuid4())
    assert (rows.status, rows.attempts) == ("failed", 1)


async def test_an_address_no_header_can_hold_fails_for_good_logged_not_pending_for_ever(rows, monkeypatch):
    """(review) A stored address with \x1c (a line break to Python's e-mail headers) made the
    channel raise ValueError: the dispatcher left the delivery pending with nothing logged, and the
    sweeper tried it again at every sweep, for ever, a stack trace each time."""
    sent: list[object] = []

    async def fake_send(message: object, **kwargs: object) -> None:
        sent.append(message)

    monkeypatch.setattr(aiosmtplib, "send", fake_send)
    rows.recipient = "email:a\x1cb@example.com"
    dispatcher = Dispatcher(_Pool(), [EmailChannel(Settings(mail_from="a@t.example"))], "https://console", retry=FAST)  # type: ignore[arg-type]
    await dispatcher.deliver(uuid.uuid4())
    assert (rows.status, rows.attempts, len(rows.log), sent) == ("failed", 1, 1, [])
    assert "cannot be written in a header" in (rows.error or "") and rows.log[0].error == rows.error
    await dispatcher.stop()


class _Broken:
    """A channel that breaks in a way nobody foresaw (not a DeliveryError), every time."""

    channel = Channel.EMAIL

    def __init__(self, error: Exception) -> None:
        self.error, self.calls = error, 0

    async def send(self, conn: Any, delivery: store.PendingDelivery, message: Any) -> None:
        self.calls += 1
        raise self.error


async def test_a_delivery_that_breaks_waits_its_backoff_and_fails_after_its_window(rows):
    """(review) Whatever broke an attempt or its record besides Postgres going away (a receiver's
    answer, an address, the log's write) left the delivery pending and due: taken again at every
    sweep (15 s), for ever, past its window, with nothing in its log. It now waits its backoff,
    like a failed attempt, and fails when its window is over."""
    channel = _Broken(ValueError("no header can hold this"))
    dispatcher = Dispatcher(_Pool(), [channel], "https://console", retry=FAST, webhook_backoff=Backoff(30, 3600, 86400))  # type: ignore[arg-type]
    delivery_id = uuid.uuid4()
    await dispatcher.deliver(delivery_id)
    assert (rows.status, rows.attempts, rows.error) == ("pending", 1, "the delivery broke: ValueError")
    due = rows.next_attempt_at
    assert due is not None and timedelta(seconds=29) < due - datetime.now(UTC) <= timedelta(seconds=34)
    await dispatcher.deliver(delivery_id)  # a sweep before it is due: nothing
    assert channel.calls == 1
    rows.next_attempt_at = datetime.now(UTC)
    await dispatcher.deliver(delivery_id)
    assert (rows.status, rows.attempts, channel.calls) == ("pending", 2, 2)
    await dispatcher.stop()

    rows.status, rows.attempts, rows.next_attempt_at = "pending", 0, None
    short = Dispatcher(_Pool(), [_Broken(ValueError("x"))], "https://console", retry=FAST, webhook_backoff=Backoff(30, 3600, 10))  # type: ignore[arg-type]
    await short.deliver(uuid.uuid4())
    assert (rows.status, rows.error) == ("failed", "the delivery broke: ValueError")
    await short.stop()


async def test_postgres_going_away_mid_delivery_leaves_it_pending_and_due(rows):
    channel = _Broken(psycopg.OperationalError("the connection is lost"))
    dispatcher = Dispatcher(_Pool(), [channel], "https://console", retry=FAST)  # type: ignore[arg-type]
    await dispatcher.deliver(uuid.uuid4())
    assert (rows.status, rows.attempts, rows.next_attempt_at) == ("pending", 0, None)  # the sweeper resumes it
    await dispatcher.stop()
