"""SMS and e-mail pumping through alert rules, end to end on real Kafka, Postgres, an aiosmtpd SMTP
server and an HTTP SMS gateway: a rule whose threshold is already passed fires at creation, so a
create/delete loop with fresh outside addresses would send a message on every turn at the
platform's cost. The account's daily budget of outside messages stops it; the in-site alert of
every firing still arrives, and the held-back messages are in the rule's delivery log."""

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from contracts.alerts_api import Channel, EmailRecipient
from contracts.common import AlertMetric, Resource
from services.alerts import store
from tests.integration.test_alerts_helpers import (  # noqa: F401  (fixtures)
    SmsGateway,
    SmtpServer,
    alert_settings,
    all_settled,
    eventually,
    login,
    publish_quota_state,
    query,
    sms_gateway_fixture,
    smtp_server_fixture,
    this_period,
)
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


def pumping_rule(n: int) -> dict:
    """1% of api_calls, passed already; a fresh e-mail address and phone number each time."""
    return {
        "metric": "api_calls",
        "threshold_pct": 1,
        "channels": ["in_site", "email", "sms"],
        "recipients": [{"email": f"victim{n}@example.com"}, {"phone": f"+491511234{n:04d}"}],
    }


def held_back(channel: str) -> float:
    return REGISTRY.get_sample_value("tollgate_alerts_held_back_total", {"channel": channel}) or 0.0


async def test_the_create_delete_loop_stops_sending_at_the_daily_budget_and_in_site_goes_on(
    settings, smtp_server: SmtpServer, sms_gateway: SmsGateway
):
    settings = alert_settings(settings, smtp_server, sms_gateway).model_copy(update={"alerts_outside_messages_per_day": 4})
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        headers = await login(app, account)
        # a fresh free account: 12 of its 1,000 api_calls (1.2%)
        await publish_quota_state(
            app.state.runtime.broker, settings, account, Resource.API_CALLS, used=12, total=1000, period=this_period()
        )
        await eventually(lambda: len(query(settings, "SELECT 1 FROM alerts.quota_states WHERE account_id = %s", account)) == 1)
        sms_before, email_before = held_back("sms"), held_back("email")

        rule_id = ""
        for n in range(5):
            created = await client.post("/api/ai/usage/alert", json=pumping_rule(n), headers=headers)
            assert created.status_code == 201, created.text
            assert created.json()["fired_this_period"] is True
            rule_id = created.json()["id"]
            await eventually(lambda: all_settled(settings, account))  # sent (or held back), then deleted
            if n < 4:
                assert (await client.delete(f"/api/ai/usage/alert/{rule_id}", headers=headers)).status_code == 204

        # 4 outside messages: the first two turns' e-mail and SMS; nothing after
        assert sorted(m["To"] for m in smtp_server.messages) == ["victim0@example.com", "victim1@example.com"]
        assert sorted(r["json"]["to"] for r in sms_gateway.received()) == ["+4915112340000", "+4915112340001"]
        assert held_back("sms") - sms_before == 3 and held_back("email") - email_before == 3
        # every turn's in-site alert arrived
        notes = (await client.get("/api/notifications", headers=headers)).json()["items"]
        assert len(notes) == 5 and {n["threshold_pct"] for n in notes} == {1}

        log = (await client.get(f"/api/ai/usage/alert/{rule_id}/deliveries", headers=headers)).json()["items"]
        by_channel = {item["channel"]: item for item in log}
        assert by_channel["in_site"]["status"] == "sent"
        for channel in ("email", "sms"):
            item = by_channel[channel]
            assert item["status"] == "failed" and item["attempt"] == 0 and item["next_attempt_at"] is None
            assert "daily limit of 4 outside alert messages" in item["error"], item
        listed = (await client.get("/api/ai/usage/alert", headers=headers)).json()["rules"]
        assert [r["failed_deliveries"] for r in listed] == [2]


async def test_two_creations_at_once_do_not_both_pass_the_rule_cap(settings):
    settings = settings.model_copy(update={"alerts_max_rules_per_account": 6})
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        headers = await login(app, account)
        rule = {"metric": "api_calls", "threshold_pct": 90, "channels": ["in_site"], "recipients": []}
        answers = await asyncio.gather(*(client.post("/api/ai/usage/alert", json=rule, headers=headers) for _ in range(9)))
        assert sorted(a.status_code for a in answers) == [201] * 6 + [422] * 3, [a.text for a in answers]
        refused = next(a.json() for a in answers if a.status_code == 422)
        assert refused["error"]["code"] == "validation_error"
        assert refused["error"]["details"] == [
            {"field": "rules", "message": "At most 6 alert rules per account.", "type": "too_many"}
        ]
        assert len((await client.get("/api/ai/usage/alert", headers=headers)).json()["rules"]) == 6


async def test_two_firings_at_once_do_not_both_take_the_last_slot(settings):
    """Two transactions (a creation and a crossing, two consumers...) each read the budget, wait,
    then record: the row lock makes the second read what the first wrote."""
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)):  # its migrations
        async with AsyncConnectionPool(
            settings.database_url, min_size=2, max_size=2, kwargs={"row_factory": dict_row, "autocommit": False}
        ) as pool:

            async def fire(n: int) -> list[uuid.UUID]:
                async with pool.connection() as conn, conn.transaction():
                    rule = await store.insert_rule(
                        conn,
                        account,
                        AlertMetric.API_CALLS,
                        1,
                        [Channel.EMAIL],
                        [EmailRecipient(email=f"v{n}@example.com")],
                        datetime.now(UTC),
                    )
                    budget = await store.lock_outside_budget(conn, account, "2026-11-15", per_day=1)
                    await asyncio.sleep(0.3)  # the other one reads meanwhile (or waits for this one)
                    return await store.record_firing(conn, store.Firing(rule, "2026-11", 12, 1000, "creation", budget=budget))

            sent = await asyncio.gather(fire(1), fire(2))
        assert sorted(len(ids) for ids in sent) == [0, 1]
        rows = query(settings, "SELECT queued, suppressed FROM alerts.outside_messages WHERE account_id = %s", account)
        assert rows == [{"queued": 1, "suppressed": 1}]
        statuses = query(
            settings,
            """SELECT d.status FROM alerts.deliveries d JOIN alerts.firings f ON f.id = d.firing_id
                WHERE f.account_id = %s ORDER BY d.status""",
            account,
        )
        assert [r["status"] for r in statuses] == ["failed", "pending"]
