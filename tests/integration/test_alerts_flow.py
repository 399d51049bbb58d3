"""Alert rules end to end on real Kafka, Postgres, an aiosmtpd SMTP server and an HTTP gateway."""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaConsumer

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.period import period_bounds, period_of
from contracts.topics import QUOTA_THRESHOLDS, USAGE, dead_letter
from services.edge import Overrides
from tests.integration.quota_helpers import SettableClock
from tests.integration.test_alerts_helpers import (  # noqa: F401  (fixtures)
    CONSOLE_URL,
    SmsGateway,
    SmtpServer,
    alert_settings,
    all_settled,
    eventually,
    firing_count,
    login,
    next_period,
    publish_crossing,
    publish_quota_state,
    query,
    sms_gateway_fixture,
    smtp_server_fixture,
    this_period,
)
from tests.support.apps import running_app

pytestmark = pytest.mark.integration

EMAILS = ["ops@example.com", "cfo@example.com"]
PHONE = "+4915112345678"


def _rule(threshold: int, metric: str = "total_tokens", channels: tuple[str, ...] = ("in_site", "email", "sms")) -> dict:
    recipients: list[dict] = []
    if "email" in channels:
        recipients += [{"email": e} for e in EMAILS]
    if "sms" in channels:
        recipients.append({"phone": PHONE})
    return {"metric": metric, "threshold_pct": threshold, "channels": list(channels), "recipients": recipients}


async def test_a_jump_fires_the_80_and_90_rules_once_each_on_every_channel_and_again_next_period(
    settings, smtp_server: SmtpServer, sms_gateway: SmsGateway
):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        broker = app.state.runtime.broker
        headers = await login(app, account)
        r80 = (await client.post("/api/ai/usage/alert", json=_rule(80), headers=headers)).json()
        r90 = (await client.post("/api/ai/usage/alert", json=_rule(90), headers=headers)).json()
        assert r80["fired_this_period"] is False and r80["last_fired_at"] is None
        # An api_calls rule must not fire on an ai_tokens crossing.
        other = await client.post("/api/ai/usage/alert", json=_rule(10, "api_calls", ("in_site",)), headers=headers)
        assert other.status_code == 201

        period = this_period()
        await publish_crossing(broker, settings, account, 50, period=period)
        jump = await publish_crossing(broker, settings, account, 95, period=period)
        await publish_crossing(broker, settings, account, 95, period=period, event_id=jump.id)  # redelivered duplicate

        async def two_notifications() -> bool:
            items = (await client.get("/api/notifications", headers=headers)).json()["items"]
            return len(items) == 2

        await eventually(two_notifications)
        await eventually(lambda: all_settled(settings, account))

        notes = (await client.get("/api/notifications", headers=headers)).json()["items"]
        assert sorted(n["threshold_pct"] for n in notes) == [80, 90]
        for note in notes:
            assert note["metric"] == "total_tokens" and note["read"] is False
            assert "95,000" in note["message"] and "100,000" in note["message"]
            assert note["links"] == {
                "upgrade_plan": f"{CONSOLE_URL}/plan",
                "buy_quota_package": f"{CONSOLE_URL}/quota?buy=ai_tokens",
            }
        # E-mail: one per rule and recipient, multipart text + HTML, stable Message-ID, both links.
        for address in EMAILS:
            mails = smtp_server.to(address)
            assert len(mails) == 2, [m["Subject"] for m in mails]
            assert sorted("80%" in m["Subject"] for m in mails) == [False, True]
            for mail in mails:
                assert mail.is_multipart()
                parts = {p.get_content_type(): p.get_payload(decode=True).decode() for p in mail.walk() if not p.is_multipart()}
                assert set(parts) == {"text/plain", "text/html"}
                for body in parts.values():
                    assert "total_tokens" in body and "95,000" in body and "100,000" in body
                    assert f"{CONSOLE_URL}/plan" in body and f"{CONSOLE_URL}/quota?buy=ai_tokens" in body
                assert mail["Message-ID"].startswith("<") and mail["Message-ID"].endswith("@alerts.tollgate>")
        assert len({m["Message-ID"] for m in smtp_server.messages}) == 4
        # SMS: one per rule, with the token, an idempotency key and the facts.
        sms = sms_gateway.received()
        assert len(sms) == 2
        for request in sms:
            assert request["headers"]["authorization"] == "Bearer gateway-token"
            assert request["json"]["to"] == PHONE
            assert request["headers"]["idempotency-key"] == request["json"]["reference"]
            text = request["json"]["message"]
            assert "total_tokens" in text and "95,000" in text and "100,000" in text and f"{CONSOLE_URL}/plan" in text

        listed = {r["id"]: r for r in (await client.get("/api/ai/usage/alert", headers=headers)).json()["rules"]}
        assert listed[r80["id"]]["fired_this_period"] and listed[r90["id"]]["fired_this_period"]
        assert listed[r80["id"]]["last_fired_at"] is not None
        assert listed[other.json()["id"]]["fired_this_period"] is False
        assert listed[r80["id"]]["failed_deliveries"] == 0

        # More usage in the period: nothing more. A later 99% rule is the sentinel: the topic is
        # ordered per account, so once it fired, the 96/97% events before it were handled.
        await publish_crossing(broker, settings, account, 96, period=period)
        await publish_crossing(broker, settings, account, 97, period=period)
        sentinel = await client.post("/api/ai/usage/alert", json=_rule(99, channels=("in_site",)), headers=headers)
        await publish_crossing(broker, settings, account, 99, period=period)
        await eventually(lambda: firing_count(settings, account) == 3)
        await eventually(lambda: all_settled(settings, account))
        assert len(smtp_server.messages) == 4 and len(sms_gateway.received()) == 2
        rows = query(settings, "SELECT rule_id FROM alerts.firings WHERE account_id = %s", account)
        assert sorted(str(r["rule_id"]) for r in rows) == sorted([r80["id"], r90["id"], sentinel.json()["id"]])

        # The next period: both can fire again.
        await publish_crossing(broker, settings, account, 85, period=next_period(period))
        await eventually(lambda: firing_count(settings, account) == 4)
        await publish_crossing(broker, settings, account, 91, period=next_period(period))
        await eventually(lambda: firing_count(settings, account) == 5)
        await eventually(lambda: all_settled(settings, account))
        assert len(smtp_server.messages) == 8 and len(sms_gateway.received()) == 4
        assert len({m["Message-ID"] for m in smtp_server.messages}) == 8


async def test_a_rule_whose_threshold_is_already_passed_fires_once_at_creation(
    settings, smtp_server: SmtpServer, sms_gateway: SmsGateway
):
    settings = alert_settings(settings, smtp_server, sms_gateway)
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        broker = app.state.runtime.broker
        headers = await login(app, account)
        period = this_period()
        await publish_quota_state(broker, settings, account, Resource.AI_TOKENS, used=850, total=1000, period=period)
        # Last period's flow usage does not count for this period.
        year, month = (int(p) for p in period.split("-"))
        previous = f"{year - (month == 1):04d}-{(month - 2) % 12 + 1:02d}"
        await publish_quota_state(broker, settings, account, Resource.API_CALLS, used=900, total=1000, period=previous)
        await eventually(lambda: len(query(settings, "SELECT 1 FROM alerts.quota_states WHERE account_id = %s", account)) == 2)

        created = await client.post("/api/ai/usage/alert", json=_rule(80, channels=("in_site", "email")), headers=headers)
        assert created.status_code == 201, created.text
        assert created.json()["fired_this_period"] is True and created.json()["last_fired_at"] is not None
        not_yet = await client.post("/api/ai/usage/alert", json=_rule(90, channels=("in_site",)), headers=headers)
        assert not_yet.json()["fired_this_period"] is False
        calls = await client.post("/api/ai/usage/alert", json=_rule(1, "api_calls", ("in_site",)), headers=headers)
        assert calls.json()["fired_this_period"] is False

        await eventually(lambda: all_settled(settings, account))
        notes = (await client.get("/api/notifications", headers=headers)).json()["items"]
        assert [(n["threshold_pct"], n["metric"]) for n in notes] == [(80, "total_tokens")]
        assert "850" in notes[0]["message"] and "1,000" in notes[0]["message"]
        assert len(smtp_server.to(EMAILS[0])) == 1

        # The crossing that arrives later fires the 90% rule only, never the 80% one again.
        await publish_crossing(broker, settings, account, 92, period=period, total=1000)
        await eventually(lambda: firing_count(settings, account) == 2)
        await eventually(lambda: all_settled(settings, account))
        notes = (await client.get("/api/notifications", headers=headers)).json()["items"]
        assert sorted(n["threshold_pct"] for n in notes) == [80, 90]
        assert len(smtp_server.messages) == 2  # 80% rule: two addresses, once


async def test_rules_are_validated_scoped_to_the_account_and_notifications_can_be_read(settings):
    account, stranger = uuid.uuid4(), uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        headers = await login(app, account)
        other_headers = await login(app, stranger)
        viewer_headers = await login(app, uuid.uuid4(), roles=["viewer"])

        bad_bodies = [
            {"metric": "tokens", "threshold_pct": 80, "channels": ["in_site"], "recipients": []},
            {"metric": "api_calls", "threshold_pct": 0, "channels": ["in_site"], "recipients": []},
            {"metric": "api_calls", "threshold_pct": 101, "channels": ["in_site"], "recipients": []},
            {"metric": "api_calls", "threshold_pct": 50, "channels": [], "recipients": []},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["pigeon"], "recipients": []},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["email"], "recipients": [{"email": "not-an-address"}]},
            # one recipient is one mailbox: a To header would read `r,o@b.io` as `r` and `o@b.io`
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["email"], "recipients": [{"email": "r,o@b.io"}]},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["email"], "recipients": [{"email": "a@b.io\r\nBcc:x@y"}]},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["sms"], "recipients": [{"phone": "12345"}]},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["email"], "recipients": []},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["in_site"], "recipients": [{"email": "a@b.io"}]},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["sms"], "recipients": [{"email": "a@b.io"}]},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["in_site"], "recipients": [{"user_id": str(stranger)}]},
            {"metric": "api_calls", "threshold_pct": 50, "channels": ["in_site", "in_site"], "recipients": []},
            {
                "metric": "api_calls",
                "threshold_pct": 50,
                "channels": ["in_site"],
                "recipients": [{"email": "a@b.io", "phone": "+4915112345678"}],
            },
        ]
        for body in bad_bodies:
            response = await client.post("/api/ai/usage/alert", json=body, headers=headers)
            assert response.status_code == 422, (body, response.text)
            error = response.json()["error"]
            assert error["code"] == "validation_error" and error["details"], body

        good = {
            "metric": "storage",
            "threshold_pct": 75,
            "channels": ["in_site", "sms"],
            "recipients": [{"phone": "+14155550100"}, {"user_id": str(account)}],
        }
        created = await client.post("/api/ai/usage/alert", json=good, headers=headers)
        assert created.status_code == 201, created.text
        rule = created.json()
        assert {k: rule[k] for k in good} == good
        assert (await client.get("/api/ai/usage/alert", headers=headers)).json()["rules"][0]["id"] == rule["id"]

        # Another account sees nothing and cannot delete it; a viewer reads but cannot write.
        assert (await client.get("/api/ai/usage/alert", headers=other_headers)).json() == {"rules": []}
        assert (await client.delete(f"/api/ai/usage/alert/{rule['id']}", headers=other_headers)).status_code == 404
        denied = await client.post("/api/ai/usage/alert", json=good, headers=viewer_headers)
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "permission_denied"
        assert (await client.get("/api/ai/usage/alert", headers=viewer_headers)).status_code == 200
        assert (await client.get("/api/ai/usage/alert")).json()["error"]["code"] == "missing_credentials"

        # A malformed crossing goes to the dead-letter topic; the consumer keeps going.
        broker = app.state.runtime.broker
        await broker.publish(b"{not json", settings.topic(QUOTA_THRESHOLDS.name), key=str(account).encode())
        # A notification: read by its owner only.
        await publish_crossing(broker, settings, account, 80, period=this_period(), resource=Resource.STORAGE_BYTES)

        async def one_notification() -> bool:
            return len((await client.get("/api/notifications", headers=headers)).json()["items"]) == 1

        await eventually(one_notification)
        note = (await client.get("/api/notifications", headers=headers)).json()["items"][0]
        assert note["links"]["buy_quota_package"].endswith("/quota?buy=storage_bytes")
        assert (await client.post(f"/api/notifications/{note['id']}/read", headers=other_headers)).status_code == 404
        assert (await client.get("/api/notifications", headers=other_headers)).json() == {"items": []}
        read = await client.post(f"/api/notifications/{note['id']}/read", headers=headers)
        assert read.status_code == 200 and read.json()["read"] is True
        assert (await client.get("/api/notifications?unread_only=true", headers=headers)).json() == {"items": []}
        dead = AIOKafkaConsumer(
            settings.topic(dead_letter(QUOTA_THRESHOLDS).name),
            bootstrap_servers=settings.kafka_bootstrap_servers,
            auto_offset_reset="earliest",
        )
        await dead.start()
        try:
            record = await asyncio.wait_for(dead.getone(), 20)
        finally:
            await dead.stop()
        assert record.value == b"{not json" and dict(record.headers)["x-error"]

        # No SMS gateway is configured here: the SMS delivery fails for good and is visible.
        await eventually(lambda: all_settled(settings, account))
        listed = (await client.get("/api/ai/usage/alert", headers=headers)).json()["rules"][0]
        assert listed["fired_this_period"] is True and listed["failed_deliveries"] == 1
        deliveries = (await client.get(f"/api/ai/usage/alert/{rule['id']}/deliveries", headers=headers)).json()["items"]
        assert sorted((d["channel"], d["status"]) for d in deliveries) == [("in_site", "sent"), ("sms", "failed")]
        assert "SMS_GATEWAY_URL" in next(d["last_error"] for d in deliveries if d["status"] == "failed")
        assert (await client.get(f"/api/ai/usage/alert/{rule['id']}/deliveries", headers=other_headers)).status_code == 404

        assert (await client.delete(f"/api/ai/usage/alert/{rule['id']}", headers=headers)).status_code == 204
        assert (await client.delete(f"/api/ai/usage/alert/{rule['id']}", headers=headers)).status_code == 404
        assert (await client.get("/api/ai/usage/alert", headers=headers)).json() == {"rules": []}
        assert len((await client.get("/api/notifications", headers=headers)).json()["items"]) == 1  # history stays


async def test_usage_counted_by_the_quota_service_fires_the_rules(settings):
    """With the real quota service: usage.v1 -> quota -> quota-thresholds.v1 / quota.v1 -> alerts."""
    account = uuid.uuid4()
    async with running_app(settings, targets=("quota", "alerts")) as (app, client):
        broker = app.state.runtime.broker
        headers = await login(app, account)
        for threshold in (80, 90):
            rule = _rule(threshold, channels=("in_site",))
            assert (await client.post("/api/ai/usage/alert", json=rule, headers=headers)).status_code == 201
        free_tokens = 100_000  # the free tier's ai_tokens (contracts/plans.toml)
        for quantity in (free_tokens // 2, free_tokens * 45 // 100):  # 50%, then a jump to 95%
            usage = UsageEvent(
                time=datetime.now(UTC), account_id=account, resource=Resource.AI_TOKENS, quantity=quantity, source="test"
            )
            await broker.publish(usage, settings.topic(USAGE.name), key=str(account).encode())

        async def both_fired() -> bool:
            items = (await client.get("/api/notifications", headers=headers)).json()["items"]
            return sorted(n["threshold_pct"] for n in items) == [80, 90]

        await eventually(both_fired, within=30)
        # quota.v1 reached alerts too: a new 95% rule fires at creation, a 96% rule does not.
        await eventually(
            lambda: query(settings, "SELECT used FROM alerts.quota_states WHERE account_id = %s", account) == [{"used": 95_000}]
        )
        r95 = await client.post("/api/ai/usage/alert", json=_rule(95, channels=("in_site",)), headers=headers)
        r96 = await client.post("/api/ai/usage/alert", json=_rule(96, channels=("in_site",)), headers=headers)
        assert (r95.json()["fired_this_period"], r96.json()["fired_this_period"]) == (True, False)
        await eventually(lambda: all_settled(settings, account))
        assert firing_count(settings, account) == 3


async def test_a_late_event_of_last_month_fires_last_months_rule_once_for_last_month(settings):
    """The quota consumer counts an event of 23:59:58 on the month's last day one second after
    midnight (its clock in the new month): the crossing is last month's, and alerts fire it for
    last month, once. (Kafka refuses records stamped an hour ahead: the test uses the month
    that began before now.)"""
    account = uuid.uuid4()
    clock = SettableClock()
    async with running_app(settings, targets=("quota", "alerts"), overrides=Overrides(clock=clock)) as (app, client):
        broker = app.state.runtime.broker
        headers = await login(app, account)
        midnight = period_bounds(this_period(), UTC)[0]
        last_month = period_of(midnight - timedelta(seconds=2), UTC)
        clock.fixed = midnight - timedelta(minutes=5)  # the rule is last month's (a rule fires for its own months)
        rule = await client.post("/api/ai/usage/alert", json=_rule(50, channels=("in_site",)), headers=headers)
        assert rule.status_code == 201
        clock.fixed = midnight + timedelta(seconds=1)
        late = UsageEvent(
            time=midnight - timedelta(seconds=2), account_id=account, resource=Resource.AI_TOKENS, quantity=60_000, source="test"
        )
        stamp = int(clock.fixed.timestamp() * 1000)  # produced at the consumer's "now"
        for event in (late, late, late.model_copy(update={"id": uuid.uuid4(), "quantity": 1_000})):
            await broker.publish(event, settings.topic(USAGE.name), key=str(account).encode(), timestamp_ms=stamp)

        marks = "SELECT period, pct FROM quota.threshold_marks WHERE account_id = %s AND resource = 'ai_tokens'"
        await eventually(lambda: query(settings, marks, account) == [{"period": last_month, "pct": 61}], within=30)
        await eventually(lambda: firing_count(settings, account) > 0)
        await asyncio.sleep(0.5)  # a second firing, if any, would follow the same crossing's path
        assert query(settings, "SELECT period FROM alerts.firings WHERE account_id = %s", account) == [{"period": last_month}]
