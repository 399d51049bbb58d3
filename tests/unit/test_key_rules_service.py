"""(v4) The keys service's use cases for a key's own rules, with fakes (tests/unit/fakes.py):
set at creation, PATCHed (absent unchanged, null cleared), published whole on keys.v1 with the
version moved on, audited with the changed fields, and refused when they may not be."""

import json
from uuid import UUID

import pytest

from contracts.audit import AuditAction
from contracts.common import Tier
from contracts.domain_errors import Forbidden, Invalid, NotFound
from contracts.key_limits import KeyRules
from contracts.keys_api import KeyUpdateRequest
from contracts.rate_limit import RateLimit
from tests.unit.fakes import ACTOR, audit_entries
from tests.unit.test_keys_service import World

RULES = KeyRules.model_validate(
    {
        "limits": [{"resource": "ai_tokens", "amount": 50000, "period": "month"}],
        "allowed_models": ["openai/gpt-4o-mini"],
        "allowed_routes": ["POST /v1/chat/*"],
        "allowed_ips": ["198.51.100.0/24"],
        "rate_limit": {"per_second": 1, "burst": 2, "per_minute": 60},
    }
)


@pytest.fixture
def world() -> World:
    return World()


def last_key_state(world: World) -> dict:
    states = [s for s in world.events("keys.v1") if s is not None]
    return states[-1]


async def test_rules_given_at_creation_are_stored_and_published(world: World):
    account = await world.register()
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR, rules=RULES)
    assert KeyRules.model_validate(row["rules"]) == RULES
    state = last_key_state(world)
    assert state["allowed_models"] == ["openai/gpt-4o-mini"] and state["rate_limit"]["burst"] == 2
    assert state["limits"] == [{"resource": "ai_tokens", "amount": 50000, "period": "month"}]


async def test_a_patch_changes_only_what_it_names_bumps_the_version_and_audits_the_changes(world: World):
    account = await world.register()
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR, rules=RULES)
    body = KeyUpdateRequest.model_validate({"allowed_models": None, "allowed_ips": ["2001:db8::1"]})
    updated = await world.service.update(account, row["id"], body, audit=ACTOR)
    assert updated["version"] == row["version"] + 1 and updated["status"] == "enabled"
    rules = KeyRules.model_validate(updated["rules"])
    assert rules.allowed_models == [] and rules.allowed_ips == ["2001:db8::1/128"]
    assert rules.limits == RULES.limits and rules.rate_limit == RULES.rate_limit and rules.allowed_routes == RULES.allowed_routes
    state = last_key_state(world)
    assert state["version"] == updated["version"] and state["allowed_models"] == [] and state["limits"]
    [delivered] = world.edge.delivered[-1].narrowed
    assert delivered.version == updated["version"]  # other replicas must not judge by the older state
    entry = audit_entries(world.store.outbox)[-1]
    assert entry.action is AuditAction.API_KEY_UPDATED
    assert entry.details == {"allowed_models": [], "allowed_ips": ["2001:db8::1/128"]}


async def test_a_patch_that_changes_nothing_writes_nothing(world: World):
    account = await world.register()
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR, rules=RULES)
    before = list(world.store.outbox)
    same = KeyUpdateRequest.model_validate({"name": "ci", "allowed_models": ["openai/gpt-4o-mini"]})
    unchanged = await world.service.update(account, row["id"], same, audit=ACTOR)
    assert unchanged["version"] == row["version"] and world.store.outbox == before


async def test_a_rate_limit_above_the_accounts_plan_is_invalid(world: World):
    account = await world.register()  # free: 5/s, burst 20, 120/min
    above = RateLimit(per_second=5, burst=20, per_minute=121)
    with pytest.raises(Invalid) as caught:
        await world.service.create_key(account, account, "ci", None, audit=ACTOR, rules=KeyRules(rate_limit=above))
    assert caught.value.details[0]["field"] == "rate_limit" and "per_minute <= 120" in caught.value.details[0]["message"]
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR)
    with pytest.raises(Invalid):
        await world.service.update(account, row["id"], KeyUpdateRequest(rate_limit=above), audit=ACTOR)
    # on a bigger plan (billing.v1 told keys), the same limit fits
    await world.service.set_plan(account, Tier.BASIC, world.clock.now, 1)
    updated = await world.service.update(account, row["id"], KeyUpdateRequest(rate_limit=above), audit=ACTOR)
    assert json.loads(json.dumps(updated["rules"]))["rate_limit"]["per_minute"] == 121


async def test_a_developer_may_not_change_another_users_key_nor_anyone_another_accounts(world: World):
    account = await world.register()
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR)
    developer = UUID(int=7)
    with pytest.raises(Forbidden):
        await world.service.update(account, row["id"], KeyUpdateRequest(name="mine"), audit=ACTOR, only_own=developer)
    other = await world.register("bob@example.com")
    with pytest.raises(NotFound):
        await world.service.update(other, row["id"], KeyUpdateRequest(name="mine"), audit=ACTOR)
    assert world.store.keys[row["id"]]["name"] == "ci"


async def test_rotation_keeps_the_keys_rules(world: World):
    account = await world.register()
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR, rules=RULES)
    new, _ = await world.service.rotate(account, row["id"], 60, audit=ACTOR)
    assert KeyRules.model_validate(new["rules"]) == RULES  # rotating must not widen what the secret may do


async def test_rotation_continues_the_keys_lineage(world: World):
    """A key made by POST starts its own lineage; each rotation's key continues its predecessor's,
    published on keys.v1, so quota counts the new key's limits where the old one's stand."""
    account = await world.register()
    row, _ = await world.service.create_key(account, account, "ci", None, audit=ACTOR, rules=RULES)
    assert row["lineage_id"] == row["id"]
    assert last_key_state(world)["lineage_id"] == str(row["id"])
    second, _ = await world.service.rotate(account, row["id"], 60, audit=ACTOR)
    third, _ = await world.service.rotate(account, second["id"], 0, audit=ACTOR)
    assert second["lineage_id"] == third["lineage_id"] == row["id"]
    states = [s for s in world.events("keys.v1") if s is not None]
    assert {s["key_id"]: s["lineage_id"] for s in states} == {
        str(k): str(row["id"]) for k in (row["id"], second["id"], third["id"])
    }
    other, _ = await world.service.create_key(account, account, "other", None, audit=ACTOR)
    assert other["lineage_id"] == other["id"]  # a new key starts a lineage of its own
