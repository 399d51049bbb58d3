"""Republishing every owner's states from Postgres (docs/architecture.md, "Kafka is transport"):
the keys, billing and quota use cases on fakes, the guard's rule, and the order a consumer keeps
when a republished state arrives after a newer one."""

import copy
import json
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from argon2 import PasswordHasher

from contracts.common import KeyStatus, Resource, Role, ServiceScope, Tier, UserType
from contracts.events import AccountState, KeyState, QuotaState, ServiceTokenState, StateComplete, UsageEvent, UserState
from contracts.keys_api import RegisterRequest
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.billing.service import BillingService
from services.edge.projections import AccountProjection, KeyProjection
from services.edge.service_tokens import ServiceTokenProjection
from services.edge.session_revocations import UserSessions
from services.keys.published import RECONCILED_TOPICS, Published
from services.keys.service import REPUBLISHED_TOPICS, KeysService
from services.quota.service import QuotaService
from services.runtime.platform.state_guard import Checked, check_topics, short_topics
from tests.unit.fakes import (
    ACTOR,
    FakeAccounts,
    FakeBillingEdge,
    FakeBillingStore,
    FakeClock,
    FakeKeysStore,
    FakeLocalEdge,
    FakeOutbox,
    FakePaymentProvider,
    FakePublisher,
    FakeQuotaStore,
)
from tests.unit.test_billing_service import BASIC, PACKAGE

TTL = 3600


# ---- keys ---------------------------------------------------------------------------------------
class Keys:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FakeKeysStore()
        self.edge = FakeLocalEdge()
        self.service = KeysService(
            self.store,
            self.edge,
            self.clock,
            session_ttl_seconds=TTL,
            hasher=PasswordHasher(time_cost=1, memory_cost=8, parallelism=1),
        )

    def events(self, topic: str) -> list[dict | None]:
        return [None if v is None else json.loads(v) for t, _k, v in self.store.outbox if t == topic]

    async def populated(self) -> dict[str, uuid.UUID]:
        """An account with a member, an enabled, a disabled and a deleted key, a live and a
        revoked service token, an old logout and a recent one."""
        s = self.service
        owner = await s.register(
            RegisterRequest(email="ada@example.com", password="pw-123456789", name="Ada", user_type=UserType.INDIVIDUAL)
        )
        account = owner["id"]
        member = await s.add_member(account, "bob@example.com", "Bob", "pw-123456789", Role.DEVELOPER, audit=ACTOR)
        enabled, _ = await s.create_key(account, account, "on", None, audit=ACTOR)
        disabled, _ = await s.create_key(account, member["id"], "off", None, audit=ACTOR)
        await s.toggle(account, disabled["id"], audit=ACTOR)
        deleted, _ = await s.create_key(account, account, "gone", None, audit=ACTOR)
        await s.delete(account, deleted["id"], audit=ACTOR)
        token, _ = await s.create_service_token("gateway", [ServiceScope.USAGE_WRITE], audit=ACTOR)
        revoked, _ = await s.create_service_token("old", [ServiceScope.USAGE_WRITE], audit=ACTOR)
        await s.revoke_service_token(revoked["id"], audit=ACTOR)
        await s.logout(account, account, "old-session", audit=ACTOR)
        self.clock.advance(seconds=TTL + 1)  # the old logout's session has expired by itself since
        await s.logout(account, member["id"], "new-session", audit=ACTOR)
        return {
            "account": account,
            "member": member["id"],
            "enabled": enabled["id"],
            "disabled": disabled["id"],
            "deleted": deleted["id"],
            "token": token["id"],
            "revoked": revoked["id"],
        }


@pytest.fixture
def keys() -> Keys:
    return Keys()


async def test_a_logout_is_kept_in_postgres_with_its_event(keys: Keys):
    account = (
        await keys.service.register(
            RegisterRequest(email="a@example.com", password="pw-123456789", name="A", user_type=UserType.INDIVIDUAL)
        )
    )["id"]
    await keys.service.logout(account, account, "s1", audit=ACTOR)
    assert list(keys.store.logouts.values()) == [
        {"user_id": account, "session_id": "s1", "account_id": account, "revoked_at": keys.clock()}
    ]


async def test_keys_republishes_every_live_state_at_its_rows_version_and_applies_it_here(keys: Keys):
    ids = await keys.populated()
    keys.store.outbox.clear()  # Kafka lost everything
    keys.edge.delivered.clear()

    counts = await keys.service.republish()

    assert counts == {"accounts.v1": 1, "users.v1": 2, "keys.v1": 2, "service-tokens.v1": 1, "sessions.v1": 1}
    states = {e["key_id"]: e for e in keys.events("keys.v1") if e is not None}
    assert set(states) == {str(ids["enabled"]), str(ids["disabled"])}  # the deleted key stays unknown: refused
    disabled = states[str(ids["disabled"])]
    row = keys.store.keys[ids["disabled"]]
    assert disabled["status"] == KeyStatus.DISABLED.value and disabled["version"] == row["version"] == 2
    assert disabled["roles"] == [Role.DEVELOPER.value]  # its creator's current role
    assert None not in keys.events("keys.v1")  # no tombstone: nothing deleted is re-emitted
    assert [e["user_id"] for e in keys.events("users.v1") if e] == sorted(str(u) for u in (ids["account"], ids["member"]))
    assert [e["token_id"] for e in keys.events("service-tokens.v1") if e] == [str(ids["token"])]
    assert [e["session_id"] for e in keys.events("sessions.v1") if e] == ["new-session"]
    assert [e["version"] for e in keys.events("accounts.v1") if e] == [keys.store.accounts[ids["account"]]["version"]]
    # and this process's edge judges by them at once
    (delivered,) = keys.edge.delivered
    assert {k.key_id for k in delivered.keys} == {ids["enabled"], ids["disabled"]}
    assert len(delivered.users) == 2 and len(delivered.service_tokens) == 1 and len(delivered.sessions) == 1


async def test_keys_republishes_only_the_topics_asked_for(keys: Keys):
    await keys.populated()
    keys.store.outbox.clear()
    assert await keys.service.republish(["service-tokens.v1"]) == {"service-tokens.v1": 1}
    assert {t for t, _k, _v in keys.store.outbox} == {"service-tokens.v1"}


async def test_keys_refuses_a_topic_it_does_not_own(keys: Keys):
    with pytest.raises(ValueError, match=r"quota\.v1"):
        await keys.service.republish(["keys.v1", "quota.v1"])
    assert keys.store.outbox == []


async def test_keys_counts_the_states_its_topics_should_hold(keys: Keys):
    await keys.populated()
    assert await keys.service.held_states() == {
        "keys.v1": 2,
        "accounts.v1": 1,
        "users.v1": 2,
        "service-tokens.v1": 1,
        "sessions.v1": 1,  # the old logout no longer matters
    }
    assert set(REPUBLISHED_TOPICS) == set(await keys.service.held_states())


# ---- billing ------------------------------------------------------------------------------------
NOW = datetime(2026, 11, 11, tzinfo=UTC)


async def test_billing_republishes_each_accounts_current_plan_and_this_periods_packages():
    store, outbox, edge, clock = FakeBillingStore(), FakeOutbox(), FakeBillingEdge(), FakeClock(NOW)
    service = BillingService(store, outbox, FakeAccounts(), FakePaymentProvider(), clock, ZoneInfo("UTC"), edge=edge)
    upgraded, packaged, untouched = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await service.pay(upgraded, (await service.create_order(upgraded, BASIC, audit=ACTOR)).id, audit=ACTOR)
    await service.pay(packaged, (await service.create_order(packaged, PACKAGE, audit=ACTOR)).id, audit=ACTOR)
    await service.subscription(untouched)
    assert await service.held_states() == {"billing.v1": 2}
    outbox.events.clear()
    edge.delivered.clear()

    assert await service.republish() == {"billing.v1": 2}

    events = [json.loads(v or b"") for _t, _k, v in outbox.events]
    plan = next(e for e in events if e["type"] == "plan_changed")
    assert (plan["account_id"], plan["plan"], plan["version"]) == (str(upgraded), Tier.BASIC.value, 1)
    assert plan["time"] == NOW.isoformat().replace("+00:00", "Z")  # the change's own time: consumers that have it keep it
    package = next(e for e in events if e["type"] == "package_purchased")
    assert package["account_id"] == str(packaged) and package["resource"] == Resource.AI_TOKENS.value
    (bought,) = [o for o in store.state.orders.values() if o.kind == "quota_package"]
    assert package["order_id"] == str(bought.id)  # the order's id: quota and the edge count it once
    assert [len(facts) for facts in edge.delivered] == [2]  # applied to this process's edge too

    clock.advance(days=30)  # December: November's package no longer adds to the totals
    outbox.events.clear()
    assert await service.republish() == {"billing.v1": 1}


async def test_billing_refuses_a_topic_it_does_not_own():
    service = BillingService(
        FakeBillingStore(),
        FakeOutbox(),
        FakeAccounts(),
        FakePaymentProvider(),
        FakeClock(NOW),
        ZoneInfo("UTC"),
        edge=FakeBillingEdge(),
    )
    with pytest.raises(ValueError, match=r"keys\.v1"):
        await service.republish(["keys.v1"])


# ---- quota --------------------------------------------------------------------------------------
async def test_quota_republishes_every_resource_of_every_known_account_without_crossings():
    store, publisher = FakeQuotaStore(), FakePublisher()
    clock = FakeClock(datetime(2026, 11, 15, 12, tzinfo=UTC))
    service = QuotaService(store, publisher, clock, ZoneInfo("UTC"), "https://console.test")  # type: ignore[arg-type]
    blocked, other = sorted([uuid.uuid4(), uuid.uuid4()])
    await service.count([UsageEvent(time=clock(), account_id=blocked, resource=Resource.AI_TOKENS, quantity=100_000, source="t")])
    await service.count([UsageEvent(time=clock(), account_id=other, resource=Resource.AI_TOKENS, quantity=1, source="t")])
    assert await service.held_states() == {"quota.v1": 2}
    publisher.sent.clear()

    assert await service.republish(chunk=1) == {"quota.v1": 2 * len(Resource)}

    assert {t for t, _k, _p in publisher.sent} == {QUOTA}  # no crossing announced again
    assert QUOTA_THRESHOLDS not in {t for t, _k, _p in publisher.sent}
    states = {k: QuotaState.model_validate_json(p) for _t, k, p in publisher.sent}
    tokens = states[f"{blocked}:{Resource.AI_TOKENS.value}"]
    assert tokens.blocked and tokens.used == 100_000 and tokens.period == "2026-11"
    assert not states[f"{other}:{Resource.AI_TOKENS.value}"].blocked


# ---- the guard's rule and the order consumers keep ------------------------------------------------
def test_a_topic_with_fewer_records_than_live_states_is_republished():
    held = {"keys.v1": 3, "accounts.v1": 1, "sessions.v1": 0}
    assert short_topics({"keys.v1": 0, "accounts.v1": 5, "sessions.v1": 0}, held) == ["keys.v1"]
    assert short_topics({"keys.v1": 3, "accounts.v1": 1}, held) == []  # as many: maybe complete, left alone
    assert short_topics({}, held) == ["keys.v1", "accounts.v1"]  # a topic that is gone


def test_a_republished_older_state_arriving_after_a_newer_one_changes_nothing():
    """A republish racing a toggle: the republish read version 1 (enabled), the toggle wrote
    version 2 (disabled), and version 1 arrives last, with the later time. The key stays disabled."""
    key_id, account = uuid.uuid4(), uuid.uuid4()
    t0 = datetime(2026, 11, 1, tzinfo=UTC)

    def state(version: int, status: KeyStatus, at: datetime) -> KeyState:
        return KeyState(
            time=at, account_id=account, key_id=key_id, hash="a" * 64, status=status, roles=[Role.OWNER], version=version
        )

    projection = KeyProjection()
    projection.apply(state(2, KeyStatus.DISABLED, t0))
    projection.apply(state(1, KeyStatus.ENABLED, t0 + timedelta(seconds=5)))
    current = projection.get("a" * 64)
    assert current is not None and current.status is KeyStatus.DISABLED


# ---- the CLI ---------------------------------------------------------------------------------------
def test_tollgate_republish_refuses_a_topic_no_owner_republishes():
    from typer.testing import CliRunner

    from services.runtime.host.cli import app
    from services.runtime.host.republish import OWNERS

    result = CliRunner().invoke(app, ["republish", "--topic", "keys.v1", "--topic", "usage.v1"])
    assert result.exit_code == 2 and "usage.v1" in result.output  # before any connection is made
    assert set(OWNERS) == {"accounts.v1", "users.v1", "keys.v1", "service-tokens.v1", "sessions.v1", "billing.v1", "quota.v1"}


class Owner:
    """An owner's Kafka and Postgres, faked: `records` per topic, `states` per topic; its
    republish fills the topics (`delivered`: at once, as the outbox's flush does; or not yet)."""

    def __init__(self, records: dict[str, int], states: dict[str, int], *, delivered: bool = True) -> None:
        self.records, self.states, self.delivered = records, states, delivered
        self.log: list[str] = []  # what reached Kafka, in order

    async def counts(self) -> dict[str, int]:
        return dict(self.records)

    async def held(self) -> dict[str, int]:
        return dict(self.states)

    async def republish(self, topics: list[str]) -> dict[str, int]:
        if self.delivered:
            for topic in topics:
                self.records[topic] = self.records.get(topic, 0) + self.states[topic]
                self.log.append(topic)
        return {topic: self.states[topic] for topic in topics}

    async def announce(self, record: StateComplete) -> None:
        self.log.append(f"state-complete:{record.owner}")
        self.announced = record


async def test_a_check_that_finds_every_state_in_kafka_writes_the_owners_record():
    owner = Owner({"keys.v1": 4, "accounts.v1": 1}, {"keys.v1": 3, "accounts.v1": 1})
    checked = await check_topics("keys", owner.counts, owner.held, owner.republish, owner.announce)
    assert checked == Checked(republished={}, complete=True)
    assert owner.log == ["state-complete:keys"]
    assert (owner.announced.owner, owner.announced.held) == ("keys", {"keys.v1": 3, "accounts.v1": 1})


async def test_after_a_wipe_the_owners_record_follows_its_republished_states():
    """Kafka lost everything, the owner's record with it: written again only once the republish
    is in Kafka, so an edge that reads it reads the states too (services/edge/state_complete.py)."""
    owner = Owner({}, {"keys.v1": 3, "accounts.v1": 1, "sessions.v1": 0})
    checked = await check_topics("keys", owner.counts, owner.held, owner.republish, owner.announce)
    assert checked == Checked(republished={"keys.v1": 3, "accounts.v1": 1}, complete=True)
    assert owner.log == ["keys.v1", "accounts.v1", "state-complete:keys"]


async def test_a_republish_not_yet_in_kafka_writes_no_record():
    """The outbox's flush timed out: the topics are still short, so no edge may take them as whole."""
    owner = Owner({"billing.v1": 0}, {"billing.v1": 2}, delivered=False)
    checked = await check_topics("billing", owner.counts, owner.held, owner.republish, owner.announce)
    assert checked == Checked(republished={"billing.v1": 2}, complete=False)
    assert owner.log == []
    owner.records["billing.v1"] = 2  # the relay sent it since: the next check writes the record
    checked = await check_topics("billing", owner.counts, owner.held, owner.republish, owner.announce)
    assert checked == Checked(republished={}, complete=True) and owner.log == ["state-complete:billing"]


async def test_the_first_check_holds_the_edge_until_it_wrote_the_owners_record(monkeypatch):
    """Kafka or Postgres away at start, then a republish not yet in Kafka: the edge stays held
    (not ready) and the check is tried again until one finds the topics whole."""
    import asyncio
    from contextlib import asynccontextmanager

    from services.runtime.platform import state_guard
    from services.runtime.platform.settings import Settings

    monkeypatch.setattr(state_guard, "FIRST_RETRY_S", 0.01)
    held: list[str] = []

    @asynccontextmanager
    async def hold():  # type: ignore[no-untyped-def]
        held.append("held")
        yield
        held.append("released")

    async def nothing() -> dict[str, int]:
        return {}

    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d")
    guard = state_guard.StateGuard(settings, None, None, "keys", (), nothing, nothing, hold=hold)  # type: ignore[arg-type]
    attempts = []

    async def check() -> Checked:
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError("broker away")
        return Checked(republished={"keys.v1": 1}, complete=len(attempts) > 3)

    monkeypatch.setattr(guard, "check", check)
    await guard.start()
    assert held == ["held"]
    for _ in range(100):
        if held == ["held", "released"]:
            break
        await asyncio.sleep(0.01)
    assert held == ["held", "released"] and len(attempts) == 4
    await guard.stop()


# ---- reconciling with a Postgres behind Kafka (a restore: services/keys/reconcile.py) ------------
def kafka_of(keys: Keys) -> Published:
    """What the keys topics hold: every outbox row published so far, in order."""
    published = Published()
    for topic, key, value in keys.store.outbox:
        if topic in RECONCILED_TOPICS:
            published.apply(topic, key, value)
    return published


def edge_rebuilt_from(keys: Keys) -> tuple[KeyProjection, AccountProjection, UserSessions, ServiceTokenProjection]:
    """What an edge rebuilding from the keys topics holds: every outbox row applied, in order."""
    edge, accounts, users, tokens = KeyProjection(), AccountProjection(), UserSessions(), ServiceTokenProjection()
    for topic, _key, value in keys.store.outbox:
        if value is None:
            continue
        if topic == "keys.v1":
            edge.apply(KeyState.model_validate_json(value))
        elif topic == "accounts.v1":
            accounts.apply(AccountState.model_validate_json(value))
        elif topic == "users.v1":
            users.apply(UserState.model_validate_json(value))
        elif topic == "service-tokens.v1":
            tokens.apply(ServiceTokenState.model_validate_json(value))
    return edge, accounts, users, tokens


async def test_a_republish_given_what_kafka_holds_ends_what_postgres_lost_and_outversions_what_it_rolled_back(keys: Keys):
    s = keys.service
    ids = await keys.populated()
    backup = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    # after the backup: a key, a member, a service token, an account, and the disabled key enabled
    later, _ = await s.create_key(ids["account"], ids["account"], "later", None, audit=ACTOR)
    member = await s.add_member(ids["account"], "cy@example.com", "Cy", "pw-123456789", Role.OWNER, audit=ACTOR)
    token, _ = await s.create_service_token("later", [ServiceScope.USAGE_WRITE], audit=ACTOR)
    other = await s.register(
        RegisterRequest(email="eve@example.com", password="pw-123456789", name="Eve", user_type=UserType.INDIVIDUAL)
    )
    await s.toggle(ids["account"], ids["disabled"], audit=ACTOR)
    kafka = kafka_of(keys)
    assert kafka.keys.top[ids["disabled"]] == 3
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = backup  # the restore
    keys.edge.delivered.clear()

    await s.republish(REPUBLISHED_TOPICS, kafka)

    edge, accounts, users, tokens = edge_rebuilt_from(keys)
    after = kafka_of(keys)
    assert set(after.keys.live) == {ids["enabled"], ids["disabled"]}  # the later key is ended
    disabled = keys.store.keys[ids["disabled"]]
    assert disabled["version"] == 4 and disabled["status"] == KeyStatus.DISABLED.value  # moved past Kafka's 3
    assert edge.by_id(ids["disabled"]).status is KeyStatus.DISABLED and edge.by_id(later["id"]) is None
    assert users.get(member["id"]).removed and users.ended(member["id"], 0)
    assert accounts.get(other["id"]) is None and users.get(other["id"]).removed
    assert len(tokens) == 1 and set(after.service_tokens.live) == {ids["token"]}
    assert token["id"] not in after.service_tokens.live
    # this process's edge judged by the same at once
    (delivered,) = keys.edge.delivered
    assert any(k.key_id == later["id"] and k.deleted for k in delivered.keys)
    # and nothing more to do: a second reconciliation ends nothing and moves no version
    keys.edge.delivered.clear()
    await s.republish(REPUBLISHED_TOPICS, kafka_of(keys))
    assert not any(k.deleted for k in keys.edge.delivered[0].keys)
    assert keys.store.keys[ids["disabled"]]["version"] == 4


async def test_sessions_ended_after_the_backup_stay_ended_when_the_restored_users_are_republished(keys: Keys):
    """(review) A password change or a removal after the backup ended sessions (a stolen one, say);
    the restored rows said nothing of it, and their states, republished above Kafka's versions,
    let those sessions back in. Their sessions_not_before is kept, as logouts are."""
    s = keys.service
    ids = await keys.populated()
    issued = keys.clock().timestamp()  # the sessions of both users before the backup
    keys.clock.advance(seconds=1)
    backup = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    await s.change_password(ids["account"], "pw-123456789", "a new password", audit=ACTOR)
    await s.remove_member(ids["account"], ids["member"], audit=ACTOR)
    kafka = kafka_of(keys)
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = backup  # the restore
    keys.clock.advance(seconds=1)

    await s.republish(REPUBLISHED_TOPICS, kafka)

    _, _, users, _ = edge_rebuilt_from(keys)
    assert users.ended(ids["account"], issued) and users.ended(ids["member"], issued)
    assert users.get(ids["member"]).removed  # a member removed after the backup stays removed
    assert not users.ended(ids["account"], keys.clock().timestamp())  # a login after the restore is good
    # and Postgres says the same to the next republish
    assert keys.store.users[ids["account"]]["sessions_not_before"] == kafka.users.sessions_ended[ids["account"]]
    assert keys.store.users[ids["member"]]["removed_at"] is not None


async def test_a_restore_keeps_every_end_and_disable_kafka_holds_from_after_the_backup(keys: Keys):
    """(review) A key deleted (leaked, say) or disabled, a token revoked, a member removed after the
    backup: the restored rows, republished above Kafka's versions, brought them back. The stricter
    of the backup's row and Kafka's newest state is kept, in Postgres too, audited as the operator's;
    a key disabled in the backup and enabled after is still refused again."""
    s = keys.service
    ids = await keys.populated()
    account = ids["account"]
    leaked, _ = await s.create_key(account, account, "leaked", None, audit=ACTOR)
    paused, _ = await s.create_key(account, account, "paused", None, audit=ACTOR)
    member = await s.add_member(account, "cy@example.com", "Cy", "pw-123456789", Role.DEVELOPER, audit=ACTOR)
    members_key, _ = await s.create_key(account, member["id"], "cy's", None, audit=ACTOR)
    backup = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    await s.delete(account, leaked["id"], audit=ACTOR)
    await s.toggle(account, paused["id"], audit=ACTOR)
    await s.revoke_service_token(ids["token"], audit=ACTOR)
    await s.remove_member(account, member["id"], audit=ACTOR)
    await s.toggle(account, ids["disabled"], audit=ACTOR)  # enabled after the backup
    kafka = kafka_of(keys)
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = backup  # the restore
    keys.store.outbox.clear()

    await s.republish(REPUBLISHED_TOPICS, kafka)

    edge, _, users, _ = edge_rebuilt_from(keys)
    after = copy.deepcopy(kafka)
    for topic, key, value in keys.store.outbox:
        if topic in RECONCILED_TOPICS:
            after.apply(topic, key, value)
    # Kafka's stricter states, above its versions, on every edge ...
    assert edge.by_id(leaked["id"]) is None and edge.by_id(members_key["id"]) is None
    assert edge.by_id(paused["id"]).status is KeyStatus.DISABLED and paused["id"] in after.keys.live
    assert ids["token"] not in after.service_tokens.live and users.get(member["id"]).removed
    assert after.keys.top[paused["id"]] > kafka.keys.top[paused["id"]]
    # ... and in Postgres: the console lists what the edges admit
    store = keys.store
    assert store.keys[leaked["id"]]["deleted_at"] is not None and store.keys[members_key["id"]]["deleted_at"] is not None
    assert store.keys[paused["id"]]["status"] == KeyStatus.DISABLED.value
    assert store.tokens[ids["token"]]["revoked_at"] is not None and store.users[member["id"]]["removed_at"] is not None
    audited = {(e["action"], e["target"]["id"]) for e in keys.events("audit.v1") if e["actor"]["operator"]}
    assert audited >= {
        ("api_key.deleted", str(leaked["id"])),
        ("api_key.toggled", str(paused["id"])),
        ("member.removed", str(member["id"])),
        ("service_token.revoked", str(ids["token"])),
    }
    # the backup's own stricter state wins as before: disabled in the backup, enabled after
    assert store.keys[ids["disabled"]]["status"] == KeyStatus.DISABLED.value
    assert edge.by_id(ids["disabled"]).status is KeyStatus.DISABLED
    # the backup's live key untouched
    assert edge.by_id(ids["enabled"]).status is KeyStatus.ENABLED and store.keys[ids["enabled"]]["deleted_at"] is None


async def test_an_account_kafka_holds_deleted_stays_deleted_after_a_restore_that_holds_it(keys: Keys):
    """Restored to a backup without the account (it was deleted in Kafka), then to a newer one with
    it: the account, its user and its key stay ended."""
    s = keys.service
    await keys.populated()
    older = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    other = await s.register(
        RegisterRequest(email="eve@example.com", password="pw-123456789", name="Eve", user_type=UserType.INDIVIDUAL)
    )
    key, _ = await s.create_key(other["id"], other["id"], "eve's", None, audit=ACTOR)
    newer = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = older
    await s.republish(REPUBLISHED_TOPICS, kafka_of(keys))
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = newer

    await s.republish(REPUBLISHED_TOPICS, kafka_of(keys))

    after = kafka_of(keys)
    assert other["id"] not in after.accounts.live and other["id"] not in after.users.live
    assert key["id"] not in after.keys.live
    assert keys.store.users[other["id"]]["removed_at"] is not None and keys.store.keys[key["id"]]["deleted_at"] is not None


async def test_an_account_kept_deleted_is_deleted_in_postgres_and_no_later_refill_brings_it_back(keys: Keys):
    """(leftovers) The account row had no deleted state: a later plain republish (a short
    accounts.v1's refill, given nothing of Kafka) published it live again, and its e-mail stayed
    taken. Now it is deleted in Postgres (audited as the operator's), published deleted by every
    republish, and its e-mail is free, as a removed member's is."""
    s = keys.service
    await keys.populated()
    older = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    body = RegisterRequest(email="eve@example.com", password="pw-123456789", name="Eve", user_type=UserType.INDIVIDUAL)
    other = await s.register(body)
    newer = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = older
    await s.republish(REPUBLISHED_TOPICS, kafka_of(keys))  # Kafka holds the account deleted
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = newer
    await s.republish(REPUBLISHED_TOPICS, kafka_of(keys))  # this backup holds it

    assert keys.store.accounts[other["id"]]["deleted_at"] is not None
    audited = [e for e in keys.events("audit.v1") if e["actor"]["operator"] and e["target"]["id"] == str(other["id"])]
    assert [e["action"] for e in audited] == ["account.deleted", "member.removed"]
    keys.store.outbox.clear()
    await s.republish(["accounts.v1"])  # the refill: nothing of Kafka given
    (state,) = [e for e in keys.events("accounts.v1") if e is not None and e["account_id"] == str(other["id"])]
    assert state["deleted"] is True
    _, accounts, _, _ = edge_rebuilt_from(keys)
    assert accounts.get(other["id"]) is None
    again = await s.register(body)  # the address registers anew, as another account
    assert again["id"] != other["id"]


async def test_a_rotations_expiry_set_after_the_backup_is_kept_by_a_restore(keys: Keys):
    """A key rotated with a grace after the backup got an expiry (the replaced key, leaked maybe,
    must end); the restored row had none and republished it above Kafka's version without one: the
    replaced key lived for ever. The earlier expiry is kept, in Postgres too, audited as the
    operator's; the successor, made after the backup, is ended as before."""
    s = keys.service
    ids = await keys.populated()
    account = ids["account"]
    backup = copy.deepcopy((keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens))
    successor, _ = await s.rotate(account, ids["enabled"], 3600, audit=ACTOR)
    grace_end = keys.store.keys[ids["enabled"]]["expires_at"]
    assert grace_end is not None
    kafka = kafka_of(keys)
    keys.store.accounts, keys.store.users, keys.store.keys, keys.store.tokens = backup  # the restore
    keys.store.outbox.clear()

    await s.republish(REPUBLISHED_TOPICS, kafka)

    edge, _, _, _ = edge_rebuilt_from(keys)
    kept = edge.by_id(ids["enabled"])
    assert kept.expires_at == grace_end and kept.version > kafka.keys.top[ids["enabled"]]
    assert edge.by_id(successor["id"]) is None  # made after the backup: ended
    row = keys.store.keys[ids["enabled"]]
    assert row["expires_at"] == grace_end and row["delete_at"] is None  # may be rotated again
    audited = [e for e in keys.events("audit.v1") if e["actor"]["operator"] and e["target"]["id"] == str(ids["enabled"])]
    assert [(e["action"], e["details"]) for e in audited] == [
        ("api_key.updated", {"kept_from_kafka": True, "expires_at": grace_end.isoformat()})
    ]
    # and nothing more to do: a second reconcile keeps the same expiry, writing nothing
    keys.store.outbox.clear()
    await s.republish(REPUBLISHED_TOPICS, kafka_of(keys))
    assert not [e for e in keys.events("audit.v1") if e["actor"]["operator"]]


def test_the_stricter_of_kafka_and_the_row_is_kept():
    """The rule on one key: an end is final (any version, or only its tombstone left); a disable
    only when Kafka's state is newer than the row."""
    key_id = uuid.uuid4()
    base = {
        "time": datetime(2026, 1, 1, tzinfo=UTC),
        "account_id": uuid.uuid4(),
        "key_id": key_id,
        "hash": "0" * 64,
        "roles": [Role.OWNER],
    }
    from services.keys.published import KeysHeld
    from services.keys.reconcile import stricter_in_kafka

    def held(*states: KeyState | None) -> KeysHeld:
        topic = KeysHeld(KeyState)
        for state in states:
            topic.apply(str(key_id).encode(), None if state is None else state.model_dump_json().encode())
        return topic

    disabled = KeyState(**base, status=KeyStatus.DISABLED, version=5)
    deleted = KeyState(**base, status=KeyStatus.ENABLED, deleted=True, version=6)
    enabled = KeyState(**base, status=KeyStatus.ENABLED, version=7)
    on = KeyStatus.ENABLED
    assert stricter_in_kafka(held(deleted), key_id, on, behind=()) == "deleted"
    assert stricter_in_kafka(held(deleted, None), key_id, on, behind=()) == "deleted"
    assert stricter_in_kafka(held(None), key_id, on, behind=()) == "deleted"  # compacted to its tombstone
    assert stricter_in_kafka(held(disabled), key_id, on, behind={key_id}) == "disabled"
    assert stricter_in_kafka(held(disabled), key_id, on, behind=()) is None  # the row is newer: enabled since
    assert stricter_in_kafka(held(disabled), key_id, KeyStatus.DISABLED, behind={key_id}) is None
    assert stricter_in_kafka(held(disabled, enabled), key_id, KeyStatus.DISABLED, behind={key_id}) is None
    assert stricter_in_kafka(held(), key_id, on, behind=()) is None
    # the limiter store's revocation entries (kept a week) witness what Kafka may have forgotten
    kafka = held(enabled)
    kafka.apply_revocations({key_id: (9, "disabled")})
    assert kafka.top[key_id] == 9 and stricter_in_kafka(kafka, key_id, on, behind={key_id}) == "disabled"
    assert stricter_in_kafka(held(enabled), key_id, on, behind={key_id}) is None
    kafka = held(enabled)
    kafka.apply_revocations({key_id: (3, "disabled")})  # older than Kafka's newest: enabled since
    assert stricter_in_kafka(kafka, key_id, on, behind={key_id}) is None
    kafka.apply_revocations({key_id: (3, "deleted")})  # a deletion is final
    assert stricter_in_kafka(kafka, key_id, on, behind=()) == "deleted"
    kafka = held(enabled)
    kafka.apply_revocations({key_id: (9, "deleted")})  # a deletion Kafka lost: still live in the topic
    assert kafka.ended(key_id) and key_id in kafka.live  # so a key Postgres lacks is ended there again
    kafka = held()
    kafka.apply_revocations({key_id: (9, "narrowed")})  # new rules: nothing stricter, but moved past
    assert stricter_in_kafka(kafka, key_id, on, behind={key_id}) is None and kafka.top[key_id] == 9
