"""(v4) Alert rules scoped to one API key, on fakes: which crossings reach them, once per
(rule, threshold, window), the key reference's validation, and the messages naming the key."""

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from contracts.alerts_api import Channel, RuleIn, RuleScope
from contracts.common import AlertMetric, KeyStatus, Resource, Role
from contracts.domain_errors import Invalid
from contracts.events import KeyState, QuotaState, QuotaThresholdCrossed
from contracts.key_limits import LimitPeriod
from services.alerts import chat, domain, webhook
from services.alerts.channels import render
from tests.unit.fakes import ACTOR, AlertsWorld

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)  # a Thursday of ISO week 48


@pytest.fixture
def world() -> AlertsWorld:
    return AlertsWorld(NOW)


def a_key(account: uuid.UUID, **kw) -> KeyState:
    return KeyState(
        time=NOW,
        account_id=account,
        key_id=uuid.uuid4(),
        hash="a" * 64,
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        masked_key="sk-abcd...wxyz",
        created_at=NOW - timedelta(days=3),
        **kw,
    )


def rule(threshold: int, key: uuid.UUID | None = None, metric: AlertMetric = AlertMetric.TOTAL_TOKENS) -> RuleIn:
    scope = RuleScope(api_key_id=key) if key else None
    return RuleIn(metric=metric, threshold_pct=threshold, channels=[Channel.IN_SITE], scope=scope)


def key_crossing(
    account: uuid.UUID,
    key: uuid.UUID,
    pct: int,
    window: str = "2026-11-26",
    period: LimitPeriod = LimitPeriod.DAY,
    resource: Resource = Resource.AI_TOKENS,
) -> QuotaThresholdCrossed:
    return QuotaThresholdCrossed(
        time=NOW,
        account_id=account,
        resource=resource,
        period="2026-11",
        threshold_pct=pct,
        used=pct * 500,
        total=50_000,
        api_key_id=key,
        limit_period=period,
        window=window,
    )


def account_crossing(account: uuid.UUID, pct: int) -> QuotaThresholdCrossed:
    return QuotaThresholdCrossed(
        time=NOW, account_id=account, resource=Resource.AI_TOKENS, period="2026-11", threshold_pct=pct, used=pct, total=100
    )


async def test_a_key_rule_fires_once_per_threshold_and_window_and_again_in_the_next_window(world):
    account = uuid.uuid4()
    key = a_key(account)
    await world.service.save_key(key)
    created = await world.service.create_rule(account, rule(80, key.key_id), audit=ACTOR)
    assert created.scope == RuleScope(api_key_id=key.key_id)
    assert [r.scope for r in (await world.service.list_rules(account)).rules] == [RuleScope(api_key_id=key.key_id)]

    await world.service.fire_crossing(key_crossing(account, key.key_id, 85))
    assert len(world.deliver.submitted) == 1
    await world.service.fire_crossing(key_crossing(account, key.key_id, 85))  # a replay
    await world.service.fire_crossing(key_crossing(account, key.key_id, 95))  # higher, same day
    assert len(world.deliver.submitted) == 1
    assert (await world.service.list_rules(account)).rules[0].fired_this_period

    world.clock.now = NOW + timedelta(days=1)  # tomorrow: a daily limit's new window
    assert not (await world.service.list_rules(account)).rules[0].fired_this_period
    await world.service.fire_crossing(key_crossing(account, key.key_id, 81, window="2026-11-27"))
    assert len(world.deliver.submitted) == 2
    firings = sorted(world.store.firings.values(), key=lambda f: f["period"])
    assert [(f["period"], f["api_key_id"], f["limit_period"]) for f in firings] == [
        ("2026-11-26", key.key_id, LimitPeriod.DAY),
        ("2026-11-27", key.key_id, LimitPeriod.DAY),
    ]


async def test_key_rules_and_account_rules_never_fire_on_each_others_crossings(world):
    account = uuid.uuid4()
    key, other_key = a_key(account), a_key(account)
    await world.service.save_key(key)
    await world.service.save_key(other_key)
    keyed = await world.service.create_rule(account, rule(50, key.key_id), audit=ACTOR)
    await world.service.create_rule(account, rule(50, key.key_id, metric=AlertMetric.API_CALLS), audit=ACTOR)
    whole = await world.service.create_rule(account, rule(50), audit=ACTOR)

    await world.service.fire_crossing(account_crossing(account, 90))
    assert {f["rule_id"] for f in world.store.firings.values()} == {whole.id}
    await world.service.fire_crossing(key_crossing(account, other_key.key_id, 90))  # another key's limit
    await world.service.fire_crossing(key_crossing(uuid.uuid4(), key.key_id, 90))  # a forged crossing for another account
    assert {f["rule_id"] for f in world.store.firings.values()} == {whole.id}
    await world.service.fire_crossing(key_crossing(account, key.key_id, 90))  # ai_tokens: not the api_calls rule
    assert {f["rule_id"] for f in world.store.firings.values()} == {whole.id, keyed.id}
    assert len(world.deliver.submitted) == 2


async def test_a_key_rule_does_not_fire_at_creation_from_the_accounts_standing(world):
    account = uuid.uuid4()
    key = a_key(account)
    await world.service.save_key(key)
    await world.service.save_quota_state(
        QuotaState(time=NOW, account_id=account, resource=Resource.AI_TOKENS, period="2026-11", total=100, used=99, blocked=False)
    )
    await world.service.create_rule(account, rule(80, key.key_id), audit=ACTOR)
    assert world.deliver.submitted == []
    await world.service.create_rule(account, rule(80), audit=ACTOR)  # the account's rule does
    assert len(world.deliver.submitted) == 1


async def test_the_scoped_key_must_be_a_live_key_of_the_account(world):
    account, other = uuid.uuid4(), uuid.uuid4()
    foreign, gone = a_key(other), a_key(account, deleted=True)
    await world.service.save_key(foreign)
    await world.service.save_key(gone)
    for key_id in (foreign.key_id, gone.key_id, uuid.uuid4()):
        with pytest.raises(Invalid) as refused:
            await world.service.create_rule(account, rule(80, key_id), audit=ACTOR)
        assert refused.value.details == [
            {"field": "scope.api_key_id", "message": "The key is not a key of this account.", "type": "value_error"}
        ]
    assert world.store.rules == {} and world.store.outbox == []


async def test_the_audit_entry_names_the_key(world):
    account = uuid.uuid4()
    key = a_key(account)
    await world.service.save_key(key)
    await world.service.create_rule(account, rule(80, key.key_id), audit=ACTOR)
    entry = json.loads(world.store.outbox[-1][2])
    assert entry["details"]["api_key_id"] == str(key.key_id)


KEY = uuid.UUID("22222222-0000-0000-0000-000000000001")
LINKS = domain.links_for("https://console.example", Resource.AI_TOKENS)
KEYED = domain.AlertMessage(
    AlertMetric.TOTAL_TOKENS, 80, 40_000, 50_000, "2026-W48", LINKS, domain.KeyLimitRef(KEY, "sk-abcd...wxyz", LimitPeriod.WEEK)
)
DELIVERY = uuid.UUID("11111111-2222-3333-4444-555555555555")


def test_every_channel_names_the_masked_key_and_the_limits_period():
    texts = {
        "title": KEYED.title,
        "summary": KEYED.summary(),
        "email.txt": render("email.txt.j2", KEYED, DELIVERY),
        "email.html": render("email.html.j2", KEYED, DELIVERY),
        "sms": render("sms.txt.j2", KEYED, DELIVERY),
        "slack": json.dumps(chat.slack_message(KEYED, DELIVERY)),
        "teams": json.dumps(chat.teams_message(KEYED, DELIVERY)),
    }
    for name, text in texts.items():
        assert "sk-abcd...wxyz" in text and "weekly" in text, name
    body = json.loads(webhook.payload(DELIVERY, uuid.uuid4(), uuid.uuid4(), NOW, KEYED))
    assert body["scope"] == {"api_key_id": str(KEY), "masked_key": "sk-abcd...wxyz", "limit_period": "week"}
    assert body["period"] == "2026-W48" and body["total"] == 50_000
    account_body = json.loads(
        webhook.payload(
            DELIVERY, uuid.uuid4(), uuid.uuid4(), NOW, domain.AlertMessage(AlertMetric.TOTAL_TOKENS, 80, 1, 2, "2026-11", LINKS)
        )
    )
    assert account_body["scope"] is None


def test_a_key_alerts_has_not_heard_of_is_named_by_its_id_never_a_secret():
    ref = domain.KeyLimitRef(KEY, None, LimitPeriod.ONCE)
    assert ref.key_name == f"id {KEY}" and ref.limit_name == "one-time"
    message = domain.AlertMessage(AlertMetric.TOTAL_TOKENS, 80, 1, 2, "once", LINKS, ref)
    assert str(KEY) in message.summary() and "one-time" in message.title
