"""What the keys service's use cases hand the edge to share before they answer, so that a replica
whose Kafka consumers are behind or cut off refuses at once (docs/architecture.md, "Strict ends
of sessions, users and service tokens"): a member's removal or role change with its live keys, a
password change's end of sessions, a logout, a service token's revocation. With fakes: the
delivered `Changes`."""

from contracts.common import Role, ServiceScope
from services.keys.service import UserChange
from tests.unit.fakes import ACTOR
from tests.unit.test_keys_service import OPERATOR, PASSWORD, World, world  # the fixture (re-exported below)

__all__ = ["world"]


async def test_a_role_change_hands_over_the_users_new_state_and_its_live_keys(world: World):
    account_id = await world.register()
    dev = await world.service.add_member(account_id, "dev@example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    first, _ = await world.service.create_key(account_id, dev["id"], "one", None, audit=ACTOR)
    second, _ = await world.service.create_key(account_id, dev["id"], "two", None, audit=ACTOR)
    await world.service.create_key(account_id, account_id, "the owner's", None, audit=ACTOR)
    gone, _ = await world.service.create_key(account_id, dev["id"], "deleted", None, audit=ACTOR)
    await world.service.delete(account_id, gone["id"], audit=ACTOR)
    assert all(not changes.user_changes for changes in world.edge.delivered)  # none so far

    await world.service.change_member_role(account_id, dev["id"], Role.VIEWER, audit=ACTOR)
    [change] = world.edge.delivered[-1].user_changes
    assert isinstance(change, UserChange)
    assert (change.user.user_id, change.user.role, change.user.removed) == (dev["id"], Role.VIEWER, False)
    assert change.user.version == world.store.users[dev["id"]]["version"] > dev["version"]
    assert sorted(map(str, change.key_ids)) == sorted([str(first["id"]), str(second["id"])])  # its live keys only

    delivered = len(world.edge.delivered)
    await world.service.change_member_role(account_id, dev["id"], Role.VIEWER, audit=ACTOR)  # the same role again
    assert len(world.edge.delivered) == delivered  # nothing changed, nothing to end


async def test_a_removal_hands_over_the_removed_state_and_deletes_its_keys(world: World):
    account_id = await world.register()
    dev = await world.service.add_member(account_id, "dev@example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    key, _ = await world.service.create_key(account_id, dev["id"], "one", None, audit=ACTOR)
    await world.service.remove_member(account_id, dev["id"], audit=ACTOR)
    changes = world.edge.delivered[-1]
    [change] = changes.user_changes
    assert change.user.user_id == dev["id"] and change.user.removed is True and change.key_ids == []
    # its keys' leases are dropped by their own revocations: each is delivered deleted
    assert [(k.key_id, k.deleted) for k in changes.keys] == [(key["id"], True)]


async def test_a_password_change_ends_the_users_sessions_and_leaves_its_keys_alone(world: World):
    account_id = await world.register()
    world.clock.advance(minutes=5)
    await world.service.change_password(account_id, PASSWORD, "a new password", audit=ACTOR)
    changes = world.edge.delivered[-1]
    [ended] = changes.sessions_ended
    assert ended.user_id == account_id and ended.sessions_not_before == world.clock.now
    assert changes.user_changes == []  # a key acts as its user whatever the password


async def test_the_operators_role_change_hands_over_the_registering_user_when_its_role_changes(world: World):
    account_id = await world.register()
    key, _ = await world.service.create_key(account_id, account_id, "a", None, audit=ACTOR)
    await world.service.set_roles(account_id, [Role.VIEWER], audit=OPERATOR)
    [change] = world.edge.delivered[-1].user_changes
    assert (change.user.user_id, change.user.role, change.key_ids) == (account_id, Role.VIEWER, [key["id"]])
    await world.service.set_roles(account_id, [Role.VIEWER], audit=OPERATOR)  # no change of role
    assert world.edge.delivered[-1].user_changes == []


async def test_logouts_and_token_revocations_are_handed_over_and_nothing_else_ends(world: World):
    account_id = await world.register()
    await world.service.add_member(account_id, "v@example.com", "V", "a password", Role.VIEWER, audit=ACTOR)
    await world.service.create_key(account_id, account_id, "a", None, audit=ACTOR)
    assert all(not c.user_changes and not c.sessions_ended for c in world.edge.delivered)
    await world.service.logout(account_id, account_id, "sid-1", audit=ACTOR)
    assert [(s.user_id, s.session_id) for s in world.edge.delivered[-1].sessions] == [(account_id, "sid-1")]
    row, _ = await world.service.create_service_token("gateway", [ServiceScope.KEYS_VERIFY], audit=ACTOR)
    assert not world.edge.delivered[-1].service_tokens[0].revoked
    await world.service.revoke_service_token(row["id"], audit=ACTOR)
    assert [(t.token_id, t.revoked) for t in world.edge.delivered[-1].service_tokens] == [(row["id"], True)]
