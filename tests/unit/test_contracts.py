import json
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from pydantic import ValidationError

from contracts.common import STOCK_RESOURCES, Permission, Resource, Role, Tier, UserType, permissions_of
from contracts.events import (
    BILLING_EVENTS,
    QUOTA_RECORDS,
    AccountState,
    CallEvent,
    KeyQuotaState,
    KeyState,
    PackagePurchased,
    PlanChanged,
    QuotaState,
    QuotaThresholdCrossed,
    UsageEvent,
    UserTypeChanged,
)
from contracts.plans import catalogue, parse_catalogue, user_type_may_take
from contracts.rate_limit import RateLimit
from contracts.topics import ALL_TOPICS, BILLING, KEYS, QUOTA, dead_letter

NOW = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
ACCOUNT = uuid4()

EXAMPLES = [
    UsageEvent(
        time=NOW,
        account_id=ACCOUNT,
        resource=Resource.AI_TOKENS,
        quantity=1500,
        provider="openai",
        model="gpt-4o",
        input_tokens=1000,
        output_tokens=500,
        source="chat",
    ),
    CallEvent(
        time=NOW,
        account_id=ACCOUNT,
        api_key_id=uuid4(),
        method="GET",
        path="/api/geo/projects",
        status=200,
        ip="203.0.113.9",
        user_agent="curl/8",
        latency_ms=1.25,
    ),
    KeyState(time=NOW, account_id=ACCOUNT, key_id=uuid4(), hash="a" * 64, status="enabled", roles=[Role.OWNER]),
    AccountState(time=NOW, account_id=ACCOUNT, roles=[Role.VIEWER], user_type="individual"),
    QuotaState(time=NOW, account_id=ACCOUNT, resource=Resource.API_CALLS, period="2026-11", total=1000, used=1000, blocked=True),
    QuotaThresholdCrossed(
        time=NOW, account_id=ACCOUNT, resource=Resource.AI_TOKENS, period="2026-11", threshold_pct=95, used=95, total=100
    ),
    PlanChanged(
        time=NOW,
        account_id=ACCOUNT,
        plan=Tier.BASIC,
        previous_plan=Tier.FREE,
        quotas={r: 1 for r in Resource},
        rate_limit=RateLimit(per_second=1, burst=2, per_minute=60),
    ),
    PackagePurchased(time=NOW, account_id=ACCOUNT, resource=Resource.AI_TOKENS, amount=5000, period="2026-11", order_id=uuid4()),
    UserTypeChanged(time=NOW, account_id=ACCOUNT, user_type="enterprise"),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_every_event_round_trips_through_json(event):
    restored = type(event).model_validate_json(event.model_dump_json())
    assert restored == event
    body = json.loads(event.model_dump_json())
    assert {"id", "type", "time", "account_id"} <= body.keys()


@pytest.mark.parametrize("event", EXAMPLES[-3:], ids=lambda e: e.type)
def test_billing_events_are_told_apart_by_type(event):
    parsed = BILLING_EVENTS.validate_json(event.model_dump_json())
    assert type(parsed) is type(event)


def test_quota_records_are_told_apart_by_type():
    """(v4) quota.v1 carries an account's state and a key's standing; readers parse both."""
    account = QuotaState(time=NOW, account_id=ACCOUNT, resource="ai_tokens", period="2026-11", total=10, used=1, blocked=False)
    key = KeyQuotaState(
        time=NOW, account_id=ACCOUNT, api_key_id=uuid4(), resource="ai_tokens", period="day", window="2026-11-22",
        amount=10, used=1, blocked=False, resets_at=NOW,
    )  # fmt: skip
    assert QUOTA_RECORDS.validate_json(account.model_dump_json()) == account
    assert QUOTA_RECORDS.validate_json(key.model_dump_json()) == key


def test_every_event_exports_a_json_schema():
    for event in EXAMPLES:
        schema = type(event).model_json_schema()
        assert "id" in schema["properties"] and "time" in schema["required"]


def test_events_refuse_naive_times_and_bad_fields():
    with pytest.raises(ValidationError):
        UsageEvent(time=datetime(2026, 1, 1), account_id=ACCOUNT, resource="ai_tokens", quantity=1, source="x")
    with pytest.raises(ValidationError):
        QuotaState(time=NOW, account_id=ACCOUNT, resource="ai_tokens", period="2026-13", total=1, used=0, blocked=False)
    with pytest.raises(ValidationError):
        KeyState(time=NOW, account_id=ACCOUNT, key_id=uuid4(), hash="sk-not-a-hash", status="enabled", roles=[])
    with pytest.raises(ValidationError):
        UsageEvent(time=NOW, account_id=ACCOUNT, resource="gold", quantity=1, source="x")


@pytest.mark.parametrize(
    "limits",
    [
        {"per_second": float("inf")},
        {"per_second": float("nan")},
        {"per_second": 5e-324},  # its burst's refill time is infinite
        {"per_second": 0},
        {"burst": 0},
        {"burst": 10**400},  # past a float
        {"per_minute": 10**10},
    ],
)
def test_rate_limits_that_would_overflow_the_limiters_arithmetic_are_refused(limits):
    with pytest.raises(ValidationError):
        RateLimit.model_validate({"per_second": 1, "burst": 2, "per_minute": 60} | limits)


def test_compacted_topics_and_dead_letters():
    assert KEYS.config["cleanup.policy"] == "compact" and QUOTA.config["cleanup.policy"] == "compact"
    assert len({t.name for t in ALL_TOPICS}) == len(ALL_TOPICS)
    assert BILLING.config["retention.ms"] == "-1"  # edges replay plans from the start
    assert dead_letter(KEYS).name == "keys.v1.dlq"
    assert KEYS.prefixed("t1.") == "t1.keys.v1"


def test_roles_grant_what_api_md_says():
    assert permissions_of([Role.OWNER]) == frozenset(Permission)
    viewer = permissions_of([Role.VIEWER])
    assert Permission.USAGE_READ in viewer and Permission.KEYS_WRITE not in viewer
    assert all(p.value.endswith(":read") for p in viewer)
    assert STOCK_RESOURCES == {Resource.GEO_PROJECTS, Resource.STORAGE_BYTES}


def test_the_shipped_catalogue_prices_every_tier_in_order():
    plans = catalogue()
    prices = [plans[t].monthly_price for t in (Tier.FREE, Tier.BASIC, Tier.PROFESSIONAL, Tier.ENTERPRISE)]
    assert prices == sorted(prices) and prices[0] == 0
    assert all(set(p.quotas) == set(Resource) for p in plans.values())


def test_a_catalogue_missing_a_tier_is_refused():
    with pytest.raises(ValueError, match="lacks tiers"):
        parse_catalogue(
            'currency = "USD"\n[tiers.free]\nmonthly_price = "0"\nrate_limit = {per_second=1, burst=1, per_minute=1}\n'
            "quotas = {ai_tokens=1, api_calls=1, geo_projects=1, storage_bytes=1, ai_conversations=1, content_publishes=1}\n"
        )


def test_only_individuals_are_kept_off_the_enterprise_tier():
    assert not user_type_may_take(UserType.INDIVIDUAL, Tier.ENTERPRISE)
    assert all(user_type_may_take(UserType.INDIVIDUAL, t) for t in Tier if t is not Tier.ENTERPRISE)
    assert all(user_type_may_take(UserType.ENTERPRISE, t) for t in Tier)


def test_a_key_state_without_a_lineage_is_the_start_of_its_own():
    """(v4) keys.v1 states published before lineages carry none: the key's own id."""
    from contracts.events import KeyState

    key, old = uuid4(), uuid4()
    base = {"time": "2026-11-26T00:00:00Z", "account_id": str(uuid4()), "key_id": str(key), "hash": "a" * 64}
    state = KeyState.model_validate({**base, "status": "enabled", "roles": ["owner"]})
    assert state.lineage_id is None and state.lineage == key
    assert KeyState.model_validate({**base, "status": "enabled", "roles": ["owner"], "lineage_id": str(old)}).lineage == old
