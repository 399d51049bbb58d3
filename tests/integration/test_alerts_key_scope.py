"""(v4) Alert rules that watch one key's own limit, on real Kafka and Postgres: the key comes from
keys.v1, a key crossing on quota-thresholds.v1 fires the in-site notification and one Slack post
naming the masked key and the limit's period, once per (rule, threshold, window); account
crossings leave it alone; a key that is not the account's is 422."""

import hashlib
import json
import secrets
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from contracts.common import KeyStatus, Resource, Role
from contracts.events import KeyState, QuotaThresholdCrossed
from contracts.key_limits import LimitPeriod, window_of
from contracts.topics import KEYS, QUOTA_THRESHOLDS
from services.runtime.platform.settings import Settings
from tests.integration.quota_helpers import publish
from tests.integration.test_alerts_helpers import (
    CONSOLE_URL,
    eventually,
    firing_count,
    login,
    publish_crossing,
    this_period,
)
from tests.support.apps import running_app
from tests.support.chat_receivers import serving, slack_receiver

pytestmark = pytest.mark.integration


def _fast(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"console_url": CONSOLE_URL, "webhook_allow_private_targets": True, "webhook_retry_initial_seconds": 0.3}
    )


def _key(account: uuid.UUID, masked: str) -> KeyState:
    secret = "sk-" + secrets.token_urlsafe(40)
    return KeyState(
        time=datetime.now(UTC),
        account_id=account,
        key_id=uuid.uuid4(),
        hash=hashlib.sha256(secret.encode()).hexdigest(),
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        masked_key=masked,
        created_at=datetime.now(UTC),
        limits=[{"resource": "ai_tokens", "amount": 50_000, "period": "day"}],  # type: ignore[list-item]
    )


async def _key_crossing(settings: Settings, account: uuid.UUID, key: uuid.UUID, pct: int) -> None:
    window, _ = window_of(LimitPeriod.DAY, datetime.now(UTC), UTC)
    event = QuotaThresholdCrossed(
        time=datetime.now(UTC),
        account_id=account,
        resource=Resource.AI_TOKENS,
        period=this_period(),
        threshold_pct=pct,
        used=500 * pct,
        total=50_000,
        api_key_id=key,
        limit_period=LimitPeriod.DAY,
        window=window,
    )
    await publish(settings, QUOTA_THRESHOLDS.name, [event], key=lambda e: str(e.account_id))


async def test_a_key_rule_fires_once_per_window_on_its_keys_crossings_only(settings):
    settings = _fast(settings)
    account, stranger = uuid.uuid4(), uuid.uuid4()
    key, sibling, foreign = _key(account, "sk-ci12...9xyz"), _key(account, "sk-sibl...ling"), _key(stranger, "sk-forn...eign")
    with serving(slack_receiver()) as receiver:
        async with running_app(settings, targets=("alerts",)) as (app, client):
            session = await login(app, account)
            await publish(settings, KEYS.name, [key, sibling, foreign], key=lambda e: str(e.key_id))
            body: dict[str, Any] = {
                "metric": "total_tokens",
                "threshold_pct": 80,
                "channels": ["in_site", "slack"],
                "recipients": [{"url": receiver.url()}],
                "scope": {"api_key_id": str(key.key_id)},
            }

            async def created() -> dict[str, Any] | None:  # alerts learns the key from keys.v1
                response = await client.post("/api/ai/usage/alert", json=body, headers=session)
                return response.json() if response.status_code == 201 else None

            rule = None

            async def made() -> bool:
                nonlocal rule
                rule = await created()
                return rule is not None

            await eventually(made)
            assert rule is not None and rule["scope"] == {"api_key_id": str(key.key_id)}
            listed = (await client.get("/api/ai/usage/alert", headers=session)).json()["rules"]
            assert [(r["id"], r["scope"], r["fired_this_period"]) for r in listed] == [(rule["id"], rule["scope"], False)]

            # Another account's key, and a key nobody has: 422 naming the field, alike.
            for other in (foreign.key_id, uuid.uuid4()):
                refused = await client.post(
                    "/api/ai/usage/alert", json={**body, "scope": {"api_key_id": str(other)}}, headers=session
                )
                assert refused.status_code == 422, refused.text
                error = refused.json()["error"]
                assert error["code"] == "validation_error" and error["details"][0]["field"] == "scope.api_key_id"

            # The account's own crossing and a sibling key's crossing leave the key rule alone.
            await publish_crossing(app.state.runtime.broker, settings, account, 95, period=this_period())
            await _key_crossing(settings, account, sibling.key_id, 95)
            await _key_crossing(settings, account, key.key_id, 85)

            async def notified() -> list[dict[str, Any]] | None:
                items = (await client.get("/api/notifications", headers=session)).json()["items"]
                return items or None

            await eventually(notified, within=30)
            await eventually(lambda: bool(receiver.received()), within=30)
            # A second crossing of the same threshold in the same window: nothing more.
            await _key_crossing(settings, account, key.key_id, 90)
            await publish_crossing(app.state.runtime.broker, settings, account, 99, period=this_period())
            # A marker after them on the same partition (key = account): a 97% key rule fired by a
            # 98% crossing; once it fired, the crossings before it were handled.
            marker = await client.post(
                "/api/ai/usage/alert",
                json={**body, "threshold_pct": 97, "channels": ["in_site"], "recipients": []},
                headers=session,
            )
            assert marker.status_code == 201, marker.text
            await _key_crossing(settings, account, key.key_id, 98)
            await eventually(lambda: firing_count(settings, account) == 2, within=30)

            async def both_listed() -> bool:  # an in-site notification is written just after its firing
                return len((await client.get("/api/notifications", headers=session)).json()["items"]) >= 2

            await eventually(both_listed, within=30)
            items = (await client.get("/api/notifications", headers=session)).json()["items"]
            assert len(items) == 2 and {i["api_key_id"] for i in items} == {str(key.key_id)}
            items = [i for i in items if i["threshold_pct"] == 80]
            assert "sk-ci12...9xyz" in items[0]["title"] and "daily" in items[0]["message"]
            assert len(receiver.received()) == 1
            post = receiver.received()[0]
            assert post["problem"] is None
            text = json.dumps(json.loads(post["body"]))
            assert "sk-ci12...9xyz" in text and "daily" in text and "42,500" in text and "50,000" in text
            assert "sk-" + "ci12" not in text.replace("sk-ci12...9xyz", "")  # only the mask, never more

            listed = (await client.get("/api/ai/usage/alert", headers=session)).json()["rules"]
            assert listed[0]["fired_this_period"] is True
            # The stranger sees none of it.
            stranger_session = await login(app, stranger)
            assert (await client.get("/api/ai/usage/alert", headers=stranger_session)).json()["rules"] == []
            assert (await client.get("/api/notifications", headers=stranger_session)).json()["items"] == []
