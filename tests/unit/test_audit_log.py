"""The audit log's use cases on fakes (tests/unit/fakes.py): every keys, billing and alerts write
queues exactly one audit.v1 entry in its own transaction (none when it fails or changes nothing),
and the keys service stores entries once per event id and pages them newest first."""

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import pytest
from argon2 import PasswordHasher

from contracts.alerts_api import Channel, RuleIn
from contracts.audit import PLATFORM_ACCOUNT, AuditAction, AuditContext, KeyActorOut, OperatorActorOut, UserActorOut
from contracts.billing_api import Package, PackageOrderIn
from contracts.common import AlertMetric, Resource, Role, ServiceScope, Tier, UserType
from contracts.domain_errors import Invalid, NotFound, PaymentRequired
from contracts.keys_api import RegisterRequest
from services.alerts.service import AlertsService
from services.billing import domain as billing_domain
from services.billing.service import BillingService
from services.keys.service import KeysService
from tests.unit.fakes import (
    ACTOR,
    FakeAccounts,
    FakeAlertsStore,
    FakeBillingEdge,
    FakeBillingStore,
    FakeClock,
    FakeDeliver,
    FakeKeysStore,
    FakeLocalEdge,
    FakeOutbox,
    FakePaymentProvider,
    audit_entries,
    no_refusal,
)

PASSWORD = "correct horse battery"
A = AuditAction


class Keys:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FakeKeysStore()
        self.service = KeysService(
            self.store,
            FakeLocalEdge(),
            self.clock,
            session_ttl_seconds=3600,
            hasher=PasswordHasher(time_cost=1, memory_cost=8, parallelism=1),
        )

    def actions(self) -> list[AuditAction]:
        return [e.action for e in audit_entries(self.store.outbox)]

    async def register(self, email: str = "ada@example.com") -> UUID:
        row = await self.service.register(
            RegisterRequest(email=email, password=PASSWORD, name="Ada", user_type=UserType.INDIVIDUAL)
        )
        return row["id"]

    async def store_queued(self) -> None:
        """What the keys consumer does with every queued audit.v1 event."""
        for entry in audit_entries(self.store.outbox):
            await self.service.record_audit(entry)


@pytest.fixture
def keys() -> Keys:
    return Keys()


async def test_every_keys_write_queues_one_entry_with_its_actor_target_and_address(keys: Keys):
    account = await keys.register()
    assert keys.actions() == []  # registering is not in the contract's list
    s = keys.service
    key, _ = await s.create_key(account, account, "ci", None, audit=ACTOR)
    await s.toggle(account, key["id"], audit=ACTOR)
    rotated, _ = await s.rotate(account, key["id"], 60, audit=ACTOR)
    await s.delete(account, rotated["id"], audit=ACTOR)
    member = await s.add_member(account, "dev@example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    await s.change_member_role(account, member["id"], Role.VIEWER, audit=ACTOR)
    await s.change_member_role(account, member["id"], Role.VIEWER, audit=ACTOR)  # no change: no entry
    await s.remove_member(account, member["id"], audit=ACTOR)
    await s.change_user_type(account, UserType.ENTERPRISE, audit=ACTOR)
    await s.change_user_type(account, UserType.ENTERPRISE, audit=ACTOR)  # no change: no entry
    await s.change_password(account, PASSWORD, "a new password", audit=ACTOR)
    await s.logout(account, account, "sid", audit=ACTOR)
    assert keys.actions() == [
        A.API_KEY_CREATED,
        A.API_KEY_TOGGLED,
        A.API_KEY_ROTATED,
        A.API_KEY_DELETED,
        A.MEMBER_ADDED,
        A.MEMBER_ROLE_CHANGED,
        A.MEMBER_REMOVED,
        A.USER_TYPE_CHANGED,
        A.PASSWORD_CHANGED,
        A.SESSION_LOGOUT,
    ]
    entries = audit_entries(keys.store.outbox)
    assert {e.account_id for e in entries} == {account}
    assert {(e.actor.user_id, e.actor.api_key_id, e.ip, e.user_agent) for e in entries} == {
        (ACTOR.user_id, None, "203.0.113.9", "unit-test")
    }
    created, toggled, rotation = entries[:3]
    assert (created.target.type, created.target.id, created.details) == ("api_key", str(key["id"]), {"name": "ci"})
    assert toggled.details == {"status": "disabled"}
    assert rotation.details == {"new_key_id": str(rotated["id"]), "grace_seconds": 60}
    role = entries[5]
    assert (role.target.type, role.target.id) == ("user", str(member["id"]))
    assert role.details == {"role": "viewer", "previous_role": "developer"}


async def test_a_refused_write_queues_no_entry(keys: Keys):
    account = await keys.register()
    with pytest.raises(NotFound):
        await keys.service.toggle(account, uuid4(), audit=ACTOR)
    with pytest.raises(Invalid):
        await keys.service.change_password(account, PASSWORD, PASSWORD, audit=ACTOR)
    assert keys.actions() == []


async def test_service_tokens_are_the_platforms_entries_and_a_second_revoke_is_not_one(keys: Keys):
    operator = AuditContext(operator=True, ip="198.51.100.1", user_agent="ops")
    row, _ = await keys.service.create_service_token("gw", [ServiceScope.USAGE_WRITE], audit=operator)
    await keys.service.revoke_service_token(row["id"], audit=operator)
    keys.clock.advance(seconds=1)
    await keys.service.revoke_service_token(row["id"], audit=operator)
    entries = audit_entries(keys.store.outbox)
    assert [e.action for e in entries] == [A.SERVICE_TOKEN_CREATED, A.SERVICE_TOKEN_REVOKED]
    assert {e.account_id for e in entries} == {PLATFORM_ACCOUNT}
    assert all(e.actor.operator and e.actor.user_id is None for e in entries)
    assert entries[0].details == {"name": "gw", "scopes": ["usage:write"]}


async def test_an_entry_is_stored_once_per_event_id_with_the_actors_email(keys: Keys):
    account = await keys.register()
    by_key = AuditContext(user_id=account, api_key_id=uuid4(), ip="10.0.0.1", user_agent="sdk")
    await keys.service.create_key(account, account, "ci", None, audit=by_key)
    await keys.store_queued()
    await keys.store_queued()  # a redelivery
    page = await keys.service.audit_log(account)
    [item] = page.items
    assert item.actor == KeyActorOut(user_id=account, email="ada@example.com", api_key_id=by_key.api_key_id)
    assert (item.ip, item.user_agent, page.next_cursor) == ("10.0.0.1", "sdk", None)
    assert (await keys.service.audit_log(uuid4())).items == []  # another account sees nothing


async def test_the_log_is_newest_first_in_pages_and_filtered_by_action_and_time(keys: Keys):
    account = await keys.register()
    me = AuditContext(user_id=account, ip="203.0.113.9", user_agent="unit-test")
    start = keys.clock()
    for n in range(5):
        keys.clock.advance(minutes=1)
        key, _ = await keys.service.create_key(account, account, f"k{n}", None, audit=me)
        keys.clock.advance(minutes=1)
        await keys.service.toggle(account, key["id"], audit=me)
    await keys.store_queued()

    seen, cursor = [], None
    while True:
        page = await keys.service.audit_log(account, limit=3, cursor=cursor)
        seen += page.items
        cursor = page.next_cursor
        if cursor is None:
            break
    assert len(seen) == 10 and [i.time for i in seen] == sorted((i.time for i in seen), reverse=True)
    assert isinstance(seen[0].actor, UserActorOut) and seen[0].actor.email == "ada@example.com"

    created = await keys.service.audit_log(account, action=A.API_KEY_CREATED)
    assert [i.action for i in created.items] == [A.API_KEY_CREATED] * 5
    window = await keys.service.audit_log(account, start=start + timedelta(minutes=3), end=start + timedelta(minutes=5))
    assert [i.time for i in window.items] == [start + timedelta(minutes=4), start + timedelta(minutes=3)]


async def test_a_bad_cursor_or_range_is_invalid(keys: Keys):
    account = await keys.register()
    for cursor in ("nonsense", "bm90IGEgY3Vyc29y", "MjAyNi0xMS0xNVQxMjowMDowMHxub3QtYS11dWlk"):
        with pytest.raises(Invalid):
            await keys.service.audit_log(account, cursor=cursor)
    now = keys.clock()
    with pytest.raises(Invalid):
        await keys.service.audit_log(account, start=now, end=now)


async def test_the_operators_roles_change_is_in_the_accounts_own_log_and_a_no_change_is_not(keys: Keys):
    account = await keys.register()
    operator = AuditContext(operator=True, user_agent="ops-cli")
    await keys.service.set_roles(account, [Role.OWNER, Role.BILLING], audit=operator)
    await keys.service.set_roles(account, [Role.BILLING, Role.OWNER], audit=operator)  # the same roles: no entry
    [entry] = audit_entries(keys.store.outbox)
    assert (entry.account_id, entry.action, entry.actor.operator, entry.user_agent) == (
        account,
        A.ACCOUNT_ROLES_CHANGED,
        True,
        "ops-cli",
    )
    assert (entry.target.type, entry.target.id) == ("account", str(account))
    assert entry.details == {"roles": ["owner", "billing"], "previous_roles": ["owner"]}


async def test_the_operators_entry_shows_only_operator():
    from services.keys.domain import audit_item

    row = {
        "time": datetime(2026, 11, 1, tzinfo=UTC),
        "actor_operator": True,
        "actor_user_id": None,
        "actor_email": None,
        "actor_api_key_id": None,
        "action": "service_token.created",
        "target_type": "service_token",
        "target_id": "x",
        "ip": "",
        "user_agent": "",
        "details": {},
    }
    assert audit_item(row).actor == OperatorActorOut()


# ---- billing ----------------------------------------------------------------------------------
async def test_billing_writes_queue_order_and_plan_entries_once():
    outbox, clock = FakeOutbox(), FakeClock(datetime(2026, 11, 11, tzinfo=UTC))
    service = BillingService(
        FakeBillingStore(), outbox, FakeAccounts(), FakePaymentProvider(), clock, ZoneInfo("UTC"), edge=FakeBillingEdge()
    )
    account = uuid4()
    package = PackageOrderIn(kind="quota_package", package=Package(resource=Resource.AI_TOKENS, amount=300_000))
    idem = billing_domain.Idempotency.of("k", "POST /api/billing/orders", "/api/billing/orders", package.model_dump(mode="json"))
    order = await service.create_order(account, package, idem, audit=ACTOR)
    await service.create_order(account, package, idem, audit=ACTOR)  # a retry: no second order, no entry
    await service.pay(account, order.id, audit=ACTOR)
    await service.pay(account, order.id, audit=ACTOR)  # paid already: charged once, recorded once
    with pytest.raises(PaymentRequired) as upgrade:
        await service.switch(account, Tier.BASIC, audit=ACTOR)  # an order to pay: order.created
    await service.pay(account, UUID(upgrade.value.details["order"]["id"]), audit=ACTOR)
    await service.switch(account, Tier.FREE, audit=ACTOR)
    entries = audit_entries(outbox.events)
    assert [e.action for e in entries] == [A.ORDER_CREATED, A.ORDER_PAID, A.ORDER_CREATED, A.ORDER_PAID, A.PLAN_SWITCHED]
    assert {(e.target.type, e.target.id) for e in entries[:2]} == {("order", str(order.id))}
    assert entries[0].details == {
        "kind": "quota_package",
        "amount": str(order.amount),
        "currency": order.currency,
        "package": {"resource": "ai_tokens", "amount": 300_000},
    }
    assert entries[2].details["plan"] == "basic" and entries[4].details == {"plan": "free", "previous_plan": "basic"}
    assert {e.account_id for e in entries} == {account} and {e.actor.user_id for e in entries} == {ACTOR.user_id}


# ---- alerts -----------------------------------------------------------------------------------
async def test_alert_rule_writes_queue_entries_naming_the_key_that_made_them():
    store = FakeAlertsStore()
    service = AlertsService(store, FakeClock(), ZoneInfo("UTC"), no_refusal, FakeDeliver())  # type: ignore[arg-type]
    account = uuid4()
    by_key = AuditContext(user_id=account, api_key_id=uuid4(), ip="10.0.0.2", user_agent="sdk")
    rule = await service.create_rule(
        account, RuleIn(metric=AlertMetric.TOTAL_TOKENS, threshold_pct=80, channels=[Channel.IN_SITE]), audit=by_key
    )
    await service.delete_rule(account, rule.id, audit=by_key)
    with pytest.raises(NotFound):
        await service.delete_rule(account, rule.id, audit=by_key)
    entries = audit_entries(store.outbox)
    assert [e.action for e in entries] == [A.ALERT_RULE_CREATED, A.ALERT_RULE_DELETED]
    assert {(e.actor.api_key_id, e.target.type, e.target.id) for e in entries} == {
        (by_key.api_key_id, "alert_rule", str(rule.id))
    }
    assert entries[0].details == {"metric": "total_tokens", "threshold_pct": 80, "channels": ["in_site"]}
