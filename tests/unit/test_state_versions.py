"""States of one object are ordered by the version their owner took under the row lock, never by
the clock (issue #41, item 7): two racing writes read their clocks before the lock, and replicas'
clocks disagree, so a newer state can carry an older `time`. Every projection keeps the highest
version; `time` decides only between states of one version (those from before versions: 0)."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from contracts.common import KeyStatus, Role, ServiceScope, Tier, UserType
from contracts.credentials import hash_secret
from contracts.events import AccountState, KeyState, PlanChanged, ServiceTokenState, UserState
from contracts.plans import catalogue
from contracts.rate_limit import RateLimit
from services.edge.projections import AccountProjection, KeyProjection, PlanLimits
from services.edge.service_tokens import ServiceTokenProjection
from services.edge.session_revocations import UserSessions
from tests.unit.fakes import ACTOR, FakeQuotaStore
from tests.unit.test_billing_service import BASIC
from tests.unit.test_billing_service import World as Billing
from tests.unit.test_keys_service import World

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
EARLIER = T0 - timedelta(seconds=5)  # a replica whose clock is behind, or a write that read it first
ACCOUNT = uuid.UUID("00000000-0000-4000-8000-000000000001")
DIGEST = hash_secret("sk-versions")


def key(status: KeyStatus, at: datetime, version: int, *, deleted: bool = False) -> KeyState:
    return KeyState(
        time=at,
        account_id=ACCOUNT,
        key_id=ACCOUNT,
        hash=DIGEST,
        status=status,
        deleted=deleted,
        roles=[Role.OWNER],
        version=version,
    )


def seen(keys: KeyProjection) -> tuple[KeyStatus, int] | None:
    state = keys.get(DIGEST)
    return None if state is None else (state.status, state.version)


# ---- every projection: the higher version wins, whatever its time -----------------------------
def test_the_key_projection_keeps_the_higher_version_even_when_its_time_is_older():
    keys = KeyProjection()
    keys.apply(key(KeyStatus.ENABLED, T0, 2))
    keys.apply(key(KeyStatus.DISABLED, EARLIER, 3))  # the newer toggle, stamped by a slower clock
    assert seen(keys) == (KeyStatus.DISABLED, 3)
    keys.apply(key(KeyStatus.ENABLED, T0, 2))  # the older state once more (the local delivery, a replay)
    assert seen(keys) == (KeyStatus.DISABLED, 3)


def test_an_older_version_after_the_deletion_does_not_bring_the_key_back():
    keys = KeyProjection()
    keys.apply(key(KeyStatus.ENABLED, T0, 1))
    keys.apply(key(KeyStatus.ENABLED, EARLIER, 3, deleted=True))
    keys.apply(key(KeyStatus.DISABLED, T0, 2))  # e.g. a toggle delivered locally after the deletion arrived
    assert keys.get(DIGEST) is None and keys.deleted(DIGEST) is not None


def test_states_from_before_versions_are_ordered_by_time_and_any_versioned_state_is_newer():
    keys = KeyProjection()
    keys.apply(key(KeyStatus.DISABLED, T0, 0))
    keys.apply(key(KeyStatus.ENABLED, EARLIER, 0))  # older, both unversioned: time decides, as before
    assert seen(keys) == (KeyStatus.DISABLED, 0)
    keys.apply(key(KeyStatus.ENABLED, EARLIER, 1))  # the first versioned write after the upgrade
    assert seen(keys) == (KeyStatus.ENABLED, 1)


def test_the_account_projection_keeps_the_higher_version_even_when_its_time_is_older():
    accounts = AccountProjection()
    newer = AccountState(time=EARLIER, account_id=ACCOUNT, roles=[Role.VIEWER], user_type=UserType.INDIVIDUAL, version=5)
    older = AccountState(time=T0, account_id=ACCOUNT, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL, version=4)
    for state in (older, newer, older):
        accounts.apply(state)
    assert accounts.get(ACCOUNT) == newer


def test_the_user_projection_keeps_the_higher_version_even_when_its_time_is_older():
    users = UserSessions()
    removed = UserState(time=EARLIER, account_id=ACCOUNT, user_id=ACCOUNT, role=Role.OWNER, removed=True, version=3)
    live = UserState(time=T0, account_id=ACCOUNT, user_id=ACCOUNT, role=Role.OWNER, version=2)
    for state in (live, removed, live):
        users.apply(state)
    assert users.get(ACCOUNT) == removed and users.ended(ACCOUNT, T0.timestamp())


def test_the_service_token_projection_keeps_the_higher_version_even_when_its_time_is_older():
    """The operator's CLI stamps a revocation with its own machine's clock."""
    tokens = ServiceTokenProjection()
    digest = hash_secret("st-versions")

    def token(at: datetime, version: int, *, revoked: bool = False) -> ServiceTokenState:
        return ServiceTokenState(
            time=at, token_id=ACCOUNT, name="gw", hash=digest, scopes=[ServiceScope.USAGE_WRITE], revoked=revoked, version=version
        )

    tokens.apply(token(T0, 1))
    tokens.apply(token(EARLIER, 2, revoked=True))
    assert tokens.get(digest) is None
    tokens.apply(token(T0, 1))  # the live state replayed: still revoked
    assert tokens.get(digest) is None


def test_plan_limits_keep_the_higher_version_even_when_its_time_is_older():
    plans = catalogue()

    def changed(tier: Tier, at: datetime, version: int) -> PlanChanged:
        plan = plans[tier]
        return PlanChanged(
            time=at, account_id=ACCOUNT, plan=tier, quotas=dict(plan.quotas), rate_limit=plan.rate_limit, version=version
        )

    limits = PlanLimits()
    for event in (changed(Tier.PROFESSIONAL, T0, 1), changed(Tier.BASIC, EARLIER, 2), changed(Tier.PROFESSIONAL, T0, 1)):
        limits.apply(event)
    assert limits.rate_limit(ACCOUNT) == plans[Tier.BASIC].rate_limit


@given(st.data())
def test_every_projection_ends_at_the_highest_version_whatever_the_times_and_the_order(data: Any):
    """Versions 1..n with any times at all (skewed clocks), delivered in any order, some twice."""
    n = data.draw(st.integers(1, 8))
    times = [T0 + timedelta(seconds=s) for s in data.draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n))]
    statuses = data.draw(st.lists(st.sampled_from(KeyStatus), min_size=n, max_size=n))
    states = [key(statuses[v], times[v], v + 1) for v in range(n)]
    stream = data.draw(st.permutations(states + data.draw(st.lists(st.sampled_from(states), max_size=4))))
    keys, limits = KeyProjection(), PlanLimits()
    for state in stream:
        keys.apply(state)
        rate = RateLimit(per_second=state.version, burst=1, per_minute=1)
        limits.apply(
            PlanChanged(time=state.time, account_id=ACCOUNT, plan=Tier.FREE, quotas={}, rate_limit=rate, version=state.version)
        )
    assert keys.get(DIGEST) == states[-1]
    assert limits.rate_limit(ACCOUNT).per_second == n


# ---- the keys service takes the versions under the row lock ------------------------------------
async def test_two_toggles_get_increasing_versions_even_when_the_clock_goes_back():
    world = World()
    account_id = await world.register()
    row, _ = await world.service.create_key(account_id, account_id, "k", None, audit=ACTOR)
    await world.service.toggle(account_id, row["id"], audit=ACTOR)
    world.clock.advance(seconds=-30)  # the second toggle served by a replica whose clock is behind
    await world.service.toggle(account_id, row["id"], audit=ACTOR)
    states = [KeyState.model_validate(e) for e in world.events("keys.v1")]
    assert [(s.status, s.version) for s in states] == [(KeyStatus.ENABLED, 1), (KeyStatus.DISABLED, 2), (KeyStatus.ENABLED, 3)]
    assert states[2].time < states[1].time
    edge = KeyProjection()  # an edge that reads keys.v1 ends where Postgres is
    for state in states:
        edge.apply(state)
    assert world.store.keys[row["id"]]["status"] == "enabled" and edge.get(states[0].hash) == states[2]


async def test_every_write_of_a_key_moves_its_version_on():
    world = World()
    account_id = await world.register()
    row, _ = await world.service.create_key(account_id, account_id, "k", None, audit=ACTOR)
    await world.service.toggle(account_id, row["id"], audit=ACTOR)
    await world.service.set_roles(account_id, [Role.VIEWER], audit=ACTOR)  # its creator's role: a new state
    await world.service.rotate(account_id, row["id"], 60, audit=ACTOR)
    world.clock.advance(seconds=61)
    await world.service.sweep_rotated()
    versions = [e["version"] for e in world.events("keys.v1") if e is not None and e["key_id"] == str(row["id"])]
    assert versions == [1, 2, 3, 4, 5]


async def test_account_user_and_service_token_states_get_increasing_versions():
    world = World()
    account_id = await world.register()
    await world.service.change_user_type(account_id, UserType.ENTERPRISE, audit=ACTOR)
    await world.service.set_roles(account_id, [Role.OWNER, Role.VIEWER], audit=ACTOR)
    assert [a["version"] for a in world.events("accounts.v1")] == [1, 2, 3]
    [user_type] = world.events("billing.v1")
    assert user_type["version"] == 2  # the account's version of the same change, as accounts.v1 says it
    dev = await world.service.add_member(account_id, "dev@example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    await world.service.change_member_role(account_id, dev["id"], Role.VIEWER, audit=ACTOR)
    await world.service.remove_member(account_id, dev["id"], audit=ACTOR)
    assert [u["version"] for u in world.events("users.v1") if u["user_id"] == str(dev["id"])] == [1, 2, 3]
    token, _ = await world.service.create_service_token("gw", [ServiceScope.USAGE_WRITE], audit=ACTOR)
    await world.service.revoke_service_token(token["id"], audit=ACTOR)
    assert [t["version"] for t in world.events("service-tokens.v1") if t is not None] == [1, 2]


def test_versions_are_optional_in_the_contract_so_old_records_still_parse():
    body = {"time": T0.isoformat(), "account_id": str(ACCOUNT), "roles": ["owner"], "user_type": "individual"}
    assert AccountState.model_validate(body).version == 0


# ---- plans and user types: billing's versions, and what billing, quota and keys keep ------------
async def test_plan_changes_get_increasing_versions_even_when_the_clock_goes_back():
    world = Billing()
    order = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    await world.service.pay(world.account, order.id, audit=ACTOR)
    world.clock.advance(seconds=-30)  # a billing replica whose clock is behind
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)  # a downgrade: at once
    changes = [PlanChanged.model_validate_json(v or b"") for t, _k, v in world.outbox.events if t == "billing.v1"]
    assert [c.version for c in changes] == [1, 2] and changes[1].time < changes[0].time


async def test_billing_keeps_the_user_type_of_the_higher_account_version_even_when_its_time_is_older():
    world = Billing()
    newer = AccountState(time=EARLIER, account_id=world.account, roles=[], user_type=UserType.ENTERPRISE, version=3)
    older = AccountState(time=T0, account_id=world.account, roles=[], user_type=UserType.INDIVIDUAL, version=2)
    await world.service.apply_user_type(newer)
    await world.service.apply_user_type(older)
    assert (await world.service.subscription(world.account)).user_type is UserType.ENTERPRISE
    world.accounts.states[world.account] = older  # the edge's copy is behind billing's own: billing's stands
    assert (await world.service.subscription(world.account)).user_type is UserType.ENTERPRISE


async def test_quota_and_keys_keep_the_plan_of_the_higher_version_even_when_its_time_is_older():
    plans = catalogue()
    quota = FakeQuotaStore()
    world = World()
    account_id = await world.register()
    for tier, at, version in ((Tier.BASIC, EARLIER, 2), (Tier.PROFESSIONAL, T0, 1)):
        await quota.set_plan(account_id, tier, plans[tier].quotas, at, version)
        await world.service.set_plan(account_id, tier, at, version)
    assert quota.plans[account_id][0] == {r.value: n for r, n in plans[Tier.BASIC].quotas.items()}
    assert (await world.service.account(account_id))["plan"] == "basic"
