"""The dispatcher against real Postgres, a real SMTP server and a real HTTP gateway: retries with
backoff, failures recorded for good, one sender per delivery."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from contracts.alerts_api import Channel, EmailRecipient, PhoneRecipient
from contracts.common import AlertMetric
from services.alerts import store
from services.alerts.channels import EmailChannel, InSiteChannel, SmsChannel, message_id
from services.alerts.dispatcher import Dispatcher, RetryPolicy
from services.alerts.webhook import Backoff
from tests.integration.test_alerts_helpers import (  # noqa: F401  (fixtures)
    SmsGateway,
    SmtpServer,
    alert_settings,
    query,
    sms_gateway_fixture,
    smtp_server_fixture,
)
from tests.support.apps import free_port

pytestmark = pytest.mark.integration
FAST = RetryPolicy(attempts=3, initial_seconds=0.01, max_seconds=0.05)
NO_WINDOW = Backoff(0.01, 0.01, 0)  # a failed round is final (the window for later rounds is over)


@pytest.fixture
async def pool(settings) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(
        settings.database_url, min_size=1, max_size=6, kwargs={"row_factory": dict_row, "autocommit": False}
    ) as opened:
        yield opened


async def _fire(pool: AsyncConnectionPool, channels: list[Channel], recipients: list) -> list[uuid.UUID]:
    async with pool.connection() as conn, conn.transaction():
        rule = await store.insert_rule(conn, uuid.uuid4(), AlertMetric.API_CALLS, 90, channels, recipients, datetime.now(UTC))
        return await store.record_firing(conn, store.Firing(rule, "2026-11", 950, 1000, "crossing"))


def _delivery(settings, delivery_id: uuid.UUID) -> dict:
    return query(settings, "SELECT * FROM alerts.deliveries WHERE id = %s", delivery_id)[0]


async def test_transient_gateway_errors_are_retried_with_the_same_idempotency_key(settings, pool, smtp_server, sms_gateway):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    sms_gateway.statuses = [503, 429]
    sms = SmsChannel(settings)
    dispatcher = Dispatcher(pool, [sms], settings.console_url, retry=FAST)
    (delivery_id,) = await _fire(pool, [Channel.SMS], [PhoneRecipient(phone="+14155550100")])
    await dispatcher.deliver(delivery_id)
    await sms.close()
    row = _delivery(settings, delivery_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("sent", 3, None)
    assert row["sent_at"] is not None
    assert [r["headers"]["idempotency-key"] for r in sms_gateway.received()] == [str(delivery_id)] * 3


async def test_a_delivery_that_keeps_failing_is_marked_failed_and_never_sent_again(settings, pool, smtp_server, sms_gateway):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    sms_gateway.always = 503
    sms = SmsChannel(settings)
    dispatcher = Dispatcher(pool, [sms], settings.console_url, retry=FAST, webhook_backoff=NO_WINDOW)
    (delivery_id,) = await _fire(pool, [Channel.SMS], [PhoneRecipient(phone="+14155550100")])
    await dispatcher.deliver(delivery_id)
    row = _delivery(settings, delivery_id)
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert "503" in row["last_error"]
    # Neither a sweep nor a repeated submit touches it again.
    assert await dispatcher.sweep() == 0
    await dispatcher.deliver(delivery_id)
    await sms.close()
    assert len(sms_gateway.received()) == 3


async def test_a_refusing_gateway_fails_at_once_and_an_unreachable_smtp_server_after_the_retries(
    settings, pool, smtp_server, sms_gateway
):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    sms_gateway.always = 400
    sms = SmsChannel(settings)
    dead_smtp = settings.model_copy(update={"smtp_port": free_port()})
    dispatcher = Dispatcher(pool, [sms, EmailChannel(dead_smtp)], settings.console_url, retry=FAST, webhook_backoff=NO_WINDOW)
    sms_id, email_id = await _fire(
        pool, [Channel.SMS, Channel.EMAIL], [PhoneRecipient(phone="+14155550100"), EmailRecipient(email="x@example.com")]
    )
    await asyncio.gather(dispatcher.deliver(sms_id), dispatcher.deliver(email_id))
    await sms.close()
    assert (_delivery(settings, sms_id)["status"], _delivery(settings, sms_id)["attempts"]) == ("failed", 1)
    assert (_delivery(settings, email_id)["status"], _delivery(settings, email_id)["attempts"]) == ("failed", 3)


async def test_an_smtp_server_down_longer_than_a_round_loses_no_alert(settings, pool, smtp_server, sms_gateway):
    """The round's attempts all fail: the delivery waits for the next round (backoff, no lock held,
    no hot loop) and is sent once the server is back, one e-mail."""
    settings = alert_settings(settings, smtp_server, sms_gateway)
    dead_smtp = settings.model_copy(update={"smtp_port": free_port()})
    down = Dispatcher(pool, [EmailChannel(dead_smtp)], settings.console_url, retry=FAST)  # 30 s, then doubling, for 24 h
    (email_id,) = await _fire(pool, [Channel.EMAIL], [EmailRecipient(email="outage@example.com")])
    await down.deliver(email_id)
    row = _delivery(settings, email_id)
    assert (row["status"], row["attempts"]) == ("pending", 3) and row["next_attempt_at"] > datetime.now(UTC)
    assert await down.sweep() == 0  # not due yet
    await down.stop()  # its wake-up timer
    query(settings, "UPDATE alerts.deliveries SET next_attempt_at = now() WHERE id = %s RETURNING id", email_id)
    up = Dispatcher(pool, [EmailChannel(settings)], settings.console_url, retry=FAST)
    assert await up.sweep() == 1
    await up.idle()
    row = _delivery(settings, email_id)
    assert (row["status"], row["attempts"]) == ("sent", 4)
    assert [m["Message-ID"] for m in smtp_server.to("outage@example.com")] == [message_id(email_id)]


async def test_during_an_outage_a_delivery_past_its_first_round_makes_one_attempt_per_call(
    settings, pool, smtp_server, sms_gateway
):
    """(review) Each later call is one attempt (as a webhook's), not another round of attempts and
    sleeps holding the row and one of the dispatcher's slots, which every account's in-site and
    webhook alerts share, at every backoff step of a 24 h outage."""
    settings = alert_settings(settings, smtp_server, sms_gateway)
    dead_smtp = settings.model_copy(update={"smtp_port": free_port()})
    down = Dispatcher(pool, [EmailChannel(dead_smtp)], settings.console_url, retry=FAST)
    (email_id,) = await _fire(pool, [Channel.EMAIL], [EmailRecipient(email="long-outage@example.com")])
    await down.deliver(email_id)
    assert _delivery(settings, email_id)["attempts"] == 3  # the first round
    for attempts in (4, 5):
        query(settings, "UPDATE alerts.deliveries SET next_attempt_at = now() WHERE id = %s RETURNING id", email_id)
        await down.deliver(email_id)
        row = _delivery(settings, email_id)
        assert (row["status"], row["attempts"]) == ("pending", attempts) and row["next_attempt_at"] > datetime.now(UTC)
    logged = query(settings, "SELECT attempt FROM alerts.delivery_attempts WHERE delivery_id = %s ORDER BY attempt", email_id)
    assert [r["attempt"] for r in logged] == [1, 2, 3, 4, 5]
    await down.stop()


async def test_concurrent_senders_and_sweeps_send_each_delivery_once(settings, pool, smtp_server, sms_gateway):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    recipients = [EmailRecipient(email=f"user{i}@example.com") for i in range(5)]
    ids = await _fire(pool, [Channel.IN_SITE, Channel.EMAIL], recipients)
    assert len(ids) == 6
    first = Dispatcher(pool, [InSiteChannel(), EmailChannel(settings)], settings.console_url, retry=FAST)
    second = Dispatcher(pool, [InSiteChannel(), EmailChannel(settings)], settings.console_url, retry=FAST)
    first.submit(ids)
    second.submit(ids)
    await first.sweep()  # may find rows the submitted tasks have not locked yet: they race, one sends
    await second.sweep()
    await asyncio.gather(first.idle(), second.idle())
    statuses = query(settings, "SELECT status, attempts FROM alerts.deliveries WHERE id = ANY(%s)", ids)
    assert [(r["status"], r["attempts"]) for r in statuses] == [("sent", 1)] * 6
    assert sorted(m["To"] for m in smtp_server.messages) == sorted(r.email for r in recipients)
    assert {m["Message-ID"] for m in smtp_server.messages} == {message_id(i) for i in ids[1:]}  # ids[0]: in-site
    assert len(query(settings, "SELECT 1 FROM alerts.notifications WHERE delivery_id = ANY(%s)", ids)) == 1
