"""Exactly one firing per threshold and one message per channel and recipient, under duplicate
events, competing consumers (two processes' worth in one group) and a SIGKILL mid-delivery."""

import asyncio
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from faststream.kafka import KafkaBroker
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contracts.alerts_api import Channel, EmailRecipient
from contracts.common import AlertMetric, Role
from contracts.events import QuotaThresholdCrossed
from services.alerts import store
from services.alerts.service import record_crossing
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.postgres import open_pool
from tests.integration.test_alerts_helpers import (  # noqa: F401  (fixtures)
    SmsGateway,
    SmtpServer,
    alert_settings,
    all_settled,
    delivery_statuses,
    eventually,
    firing_count,
    publish_account,
    publish_crossing,
    query,
    session_headers,
    sms_gateway_fixture,
    smtp_server_fixture,
    this_period,
)
from tests.support.apps import ServeProcess, running_app

pytestmark = pytest.mark.integration

EMAILS = ["a@example.com", "b@example.com"]
PHONE = "+4915112345678"
RULE = {
    "metric": "total_tokens",
    "threshold_pct": 80,
    "channels": ["in_site", "email", "sms"],
    "recipients": [{"email": EMAILS[0]}, {"email": EMAILS[1]}, {"phone": PHONE}],
}


async def test_two_transactions_deciding_the_same_crossing_record_one_firing(settings):
    async with await AsyncConnection.connect(settings.database_url, row_factory=dict_row) as setup:
        account = uuid.uuid4()
        async with setup.transaction():
            for threshold in (80, 90):
                await store.insert_rule(
                    setup,
                    account,
                    AlertMetric.TOTAL_TOKENS,
                    threshold,
                    [Channel.EMAIL],
                    [EmailRecipient(email=EMAILS[0])],
                    datetime.now(UTC),
                )
    event = QuotaThresholdCrossed.model_validate(
        {
            "time": datetime.now(UTC),
            "account_id": account,
            "resource": "ai_tokens",
            "period": this_period(),
            "threshold_pct": 95,
            "used": 95,
            "total": 100,
        }
    )

    relay = OutboxRelay(open_pool(settings.database_url), settings, "alerts")  # never started: deciding publishes nothing

    async def decide() -> list[uuid.UUID]:
        async with await AsyncConnection.connect(settings.database_url, row_factory=dict_row) as conn, conn.transaction():
            ids = await record_crossing(store.AlertsTx(conn, relay), event, settings.tz)
            await asyncio.sleep(0.2)  # hold the transaction open so the racer really overlaps
            return ids

    results = await asyncio.gather(*(decide() for _ in range(4)))
    assert sorted(len(r) for r in results).count(0) == 3  # exactly one decider recorded anything
    assert firing_count(settings, account) == 2
    assert delivery_statuses(settings, account) == {"pending": 2}


async def test_two_consumers_in_one_group_and_duplicate_events_fire_once(
    settings, smtp_server: SmtpServer, sms_gateway: SmsGateway
):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    accounts = [uuid.uuid4() for _ in range(6)]
    async with (
        running_app(settings, targets=("alerts",)) as (app1, client1),
        running_app(settings, targets=("alerts",)) as (app2, client2),
    ):
        broker = app1.state.runtime.broker
        for index, account in enumerate(accounts):
            await publish_account(broker, settings, account, [Role.OWNER])
            client, app = (client1, app1) if index % 2 else (client2, app2)
            await eventually(lambda app=app, account=account: app.state.runtime.edge.accounts.get(account) is not None)
            created = await client.post("/api/ai/usage/alert", json=RULE, headers=session_headers(settings, account))
            assert created.status_code == 201, created.text
        period = this_period()
        for account in accounts:
            event = await publish_crossing(broker, settings, account, 85, period=period)
            await publish_crossing(broker, settings, account, 85, period=period, event_id=event.id)  # redelivery
            await publish_crossing(broker, settings, account, 86, period=period)  # a later crossing
        for account in accounts:
            await eventually(lambda account=account: firing_count(settings, account) == 1)
            await eventually(lambda account=account: all_settled(settings, account))
            assert delivery_statuses(settings, account) == {"sent": 4}
    # Both processes' sweepers ran over the same rows; nothing went out twice.
    assert len(smtp_server.messages) == 2 * len(accounts)
    assert sorted(m["To"] for m in smtp_server.messages) == sorted(EMAILS * len(accounts))
    assert len({m["Message-ID"] for m in smtp_server.messages}) == 2 * len(accounts)
    assert len(sms_gateway.received()) == len(accounts)
    notes = query(settings, "SELECT account_id FROM alerts.notifications")
    assert sorted(str(n["account_id"]) for n in notes) == sorted(str(a) for a in accounts)


async def test_a_consumer_killed_mid_delivery_is_resumed_by_the_next_one_without_a_second_firing(
    settings, smtp_server: SmtpServer, sms_gateway: SmsGateway
):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    await ensure_topics(settings)
    account = uuid.uuid4()
    headers = session_headers(settings, account)
    broker = KafkaBroker(settings.kafka_bootstrap_servers)
    async with broker:
        await publish_account(broker, settings, account, [Role.OWNER])
        first = ServeProcess(settings, targets="alerts")
        try:
            await asyncio.to_thread(first.wait_ready)
            async with httpx.AsyncClient(base_url=first.base_url) as client:

                async def known() -> bool:
                    return (await client.get("/api/ai/usage/alert", headers=headers)).status_code == 200

                await eventually(known)
                assert (await client.post("/api/ai/usage/alert", json=RULE, headers=headers)).status_code == 201

            sms_gateway.hold.clear()  # the gateway takes the SMS and goes quiet: the sender waits
            event = await publish_crossing(broker, settings, account, 85, period=this_period())
            await eventually(lambda: len(sms_gateway.received()) == 1)
            await eventually(lambda: delivery_statuses(settings, account) == {"sent": 3, "pending": 1})
            first.kill()  # SIGKILL between the SMS gateway's receipt and the delivery's record
        finally:
            first.kill()
        sms_gateway.hold.set()
        await eventually(lambda: delivery_statuses(settings, account) == {"sent": 3, "pending": 1})
        await publish_crossing(broker, settings, account, 85, period=this_period(), event_id=event.id)  # redelivered

        second = ServeProcess(settings, targets="alerts")
        try:
            await asyncio.to_thread(second.wait_ready)
            await eventually(lambda: all_settled(settings, account), within=30)
            # A sentinel behind the redelivered event (same partition): once its rule fired, the
            # duplicate was consumed too (after the group dropped the killed member).
            async with httpx.AsyncClient(base_url=second.base_url) as client:
                sentinel = {"metric": "total_tokens", "threshold_pct": 86, "channels": ["in_site"], "recipients": []}
                assert (await client.post("/api/ai/usage/alert", json=sentinel, headers=headers)).status_code == 201
            await publish_crossing(broker, settings, account, 86, period=this_period())
            await eventually(lambda: firing_count(settings, account) == 2, within=45)
            await eventually(lambda: all_settled(settings, account))
        finally:
            second.stop()

    assert [r["threshold_pct"] for r in query(settings, "SELECT threshold_pct FROM alerts.firings ORDER BY 1")] == [80, 86]
    assert delivery_statuses(settings, account) == {"sent": 5}
    assert len(query(settings, "SELECT 1 FROM alerts.notifications WHERE account_id = %s", account)) == 2  # 80% + sentinel
    assert sorted(m["To"] for m in smtp_server.messages) == sorted(EMAILS)  # sent before the kill, not again
    # The SMS was in the one repeat window (received, not yet recorded): it went again with the
    # same idempotency key, so the gateway delivers one message.
    by_key = sms_gateway.by_key()
    assert len(by_key) == 1
    (requests,) = by_key.values()
    assert len(requests) == 2 and requests[0]["json"] == requests[1]["json"]
