"""Every use case of the keys service (services/keys/service.py) with fakes: an in-memory store,
a fake local edge and a fake clock. No I/O; argon2 with the cheapest parameters."""

import asyncio
import json
import threading
import time
from datetime import datetime, timedelta
from uuid import UUID, uuid4

import pytest
from argon2 import PasswordHasher

from contracts.audit import AuditContext
from contracts.common import Role, ServiceScope, Tier, UserType
from contracts.credentials import hash_secret
from contracts.domain_errors import Conflict, Forbidden, Invalid, NotFound, Unauthenticated
from contracts.errors import ErrorCode
from contracts.events import PlanChanged
from contracts.keys_api import KeyListStatus, RegisterRequest
from contracts.plans import catalogue
from services.edge import ApiError
from services.keys.domain import EmailTaken, InvalidCredentials, UserTypePlanMismatch, WrongCurrentPassword
from services.keys.login_throttle import Limit, LoginThrottle
from services.keys.service import HASHES_IN_FLIGHT, KeysService
from tests.unit.fakes import ACTOR, FakeClock, FakeKeysStore, FakeLocalEdge

OPERATOR = AuditContext(operator=True)

PASSWORD = "correct horse battery"


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = FakeKeysStore()
        self.edge = FakeLocalEdge()
        self.service = KeysService(
            self.store,
            self.edge,
            self.clock,
            session_ttl_seconds=3600,
            hasher=PasswordHasher(time_cost=1, memory_cost=8, parallelism=1),
        )

    def events(self, topic: str) -> list[dict | None]:
        return [None if v is None else json.loads(v) for t, _k, v in self.store.outbox if t == topic]

    async def register(self, email: str = "ada@example.com") -> UUID:
        row = await self.service.register(
            RegisterRequest(email=email, password=PASSWORD, name="Ada", user_type=UserType.INDIVIDUAL)
        )
        return row["id"]


@pytest.fixture
def world() -> World:
    return World()


# ---- accounts ---------------------------------------------------------------------------------
class SlowHasher(PasswordHasher):
    """argon2's cheapest parameters, each hash held 50 ms in its thread; counts hashes at once."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self._lock = threading.Lock()
        self.running = self.most = 0

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.05)
            return super().hash(password, salt=salt)
        finally:
            with self._lock:
                self.running -= 1


async def test_a_burst_of_sign_ups_holds_at_most_hashes_in_flight_argon2_hashes_at_once(world: World):
    """Each production hash holds 64 MiB: a burst from many addresses (each within its throttle)
    must not hold the memory of as many hashes as asyncio's thread pool has threads (6 here)."""
    world.service.hasher = hasher = SlowHasher()
    await asyncio.gather(*(world.register(f"burst{i}@example.com") for i in range(3 * HASHES_IN_FLIGHT)))
    assert hasher.most == HASHES_IN_FLIGHT and len(world.store.accounts) == 3 * HASHES_IN_FLIGHT


async def test_register_publishes_the_account_and_its_owner_user_and_delivers_them(world: World):
    account_id = await world.register("  Ada@Example.com ")
    account = world.store.accounts[account_id]
    assert account["email"] == "ada@example.com" and account["roles"] == ["owner"]
    assert account["password_hash"] != PASSWORD
    [acc] = world.events("accounts.v1")
    [user] = world.events("users.v1")
    assert acc["account_id"] == str(account_id) and acc["roles"] == ["owner"]
    assert user["user_id"] == str(account_id) and user["role"] == "owner"
    [changes] = world.edge.delivered
    assert len(changes.accounts) == 1 and len(changes.users) == 1


async def test_a_taken_email_is_a_conflict_and_writes_nothing(world: World):
    await world.register()
    before = list(world.store.outbox)
    with pytest.raises(EmailTaken) as caught:
        await world.register("ADA@example.com")
    assert isinstance(caught.value, Conflict) and caught.value.code == ErrorCode.CONFLICT
    assert caught.value.message == "An account with this e-mail already exists."
    assert world.store.outbox == before and len(world.store.accounts) == 1


async def test_login_with_the_right_password_issues_a_session(world: World):
    account_id = await world.register()
    token, ttl = await world.service.login("ADA@example.com", PASSWORD)
    assert token.startswith(f"tg1.{account_id}.{account_id}.") and ttl == 3600


async def test_login_with_a_wrong_password_or_an_unknown_email_is_invalid_credentials(world: World):
    await world.register()
    for email, password in (("ada@example.com", "wrong password"), ("nobody@example.com", PASSWORD)):
        with pytest.raises(InvalidCredentials) as caught:
            await world.service.login(email, password)
        assert isinstance(caught.value, Unauthenticated) and caught.value.code == ErrorCode.INVALID_CREDENTIALS


async def test_login_republishes_an_account_the_edge_does_not_know(world: World):
    account_id = await world.register()
    world.edge.accounts.clear()  # e.g. accounts.v1 was recreated
    world.store.outbox.clear()
    await world.service.login("ada@example.com", PASSWORD)
    [acc] = world.events("accounts.v1")
    assert acc["account_id"] == str(account_id)


async def test_the_throttle_counts_wrong_passwords_and_then_refuses_even_the_right_one(world: World):
    await world.register()
    now = [0.0]
    throttle = LoginThrottle(Limit(2, 60), Limit(100, 60), clock=lambda: now[0])
    for _ in range(2):
        with pytest.raises(InvalidCredentials):
            async with throttle.attempt("ada@example.com", "10.0.0.1"):
                await world.service.login("ada@example.com", "wrong password")
    with pytest.raises(ApiError) as caught:
        async with throttle.attempt("ada@example.com", "10.0.0.1"):
            await world.service.login("ada@example.com", PASSWORD)
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "60"
    now[0] = 61.0  # the window has passed: the right password gets in and clears the count
    async with throttle.attempt("ada@example.com", "10.0.0.1"):
        await world.service.login("ada@example.com", PASSWORD)


async def test_the_throttle_counts_an_ipv6_client_by_its_64(world: World):
    """Failures from one /64 are one client's, whichever of its addresses each came from."""
    await world.register()
    throttle = LoginThrottle(Limit(100, 60), Limit(2, 60), clock=lambda: 0.0)
    for host in ("1", "2"):
        with pytest.raises(InvalidCredentials):
            async with throttle.attempt("ada@example.com", f"2001:db8:7:7::{host}"):
                await world.service.login("ada@example.com", "wrong password")
    with pytest.raises(ApiError) as caught:
        async with throttle.attempt("ada@example.com", "2001:db8:7:7::3"):
            await world.service.login("ada@example.com", PASSWORD)
    assert caught.value.status == 429


class ChangedWhileVerifying(PasswordHasher):
    """argon2 with a password change by another request landing during the verify of a login."""

    def __init__(self, world: World, account_id: UUID, params: PasswordHasher) -> None:
        super().__init__(time_cost=params.time_cost, memory_cost=params.memory_cost + 8, parallelism=1)
        self.world, self.account_id = world, account_id

    def verify(self, hash: str | bytes, password: str | bytes) -> bool:
        verified = super().verify(hash, password)
        self.world.store.users[self.account_id]["password_hash"] = super().hash("a new password")
        return verified


async def test_a_password_change_during_the_login_verify_opens_no_session_and_stays(world: World):
    """(review) The old password, verified while a change landed, opens no session, and its rehash
    (the hasher's parameters changed) does not put the old password back."""
    account_id = await world.register()
    world.service.hasher = ChangedWhileVerifying(world, account_id, world.service.hasher)
    with pytest.raises(InvalidCredentials):
        await world.service.login("ada@example.com", PASSWORD)
    world.service.hasher = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
    await world.service.login("ada@example.com", "a new password")
    with pytest.raises(InvalidCredentials):
        await world.service.login("ada@example.com", PASSWORD)


async def test_a_password_change_landing_after_the_login_check_ends_the_session_it_opens(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    """(review) The session's issue time is taken with the password check (the user's row locked
    there), not afterwards: a change that lands after the check, before the session is issued,
    still ends the session the old password opened. Here it lands at the account's heal step."""
    account_id = await world.register()
    issued: list[datetime] = []
    issue = world.edge.issue_session

    def recorded(account: UUID, session_id: str, now: datetime, user_id: UUID) -> str:
        issued.append(now)
        return issue(account, session_id, now, user_id)

    async def change_lands(account: UUID) -> None:
        world.clock.advance(milliseconds=1)
        await world.service.change_password(account_id, PASSWORD, "a new password", audit=ACTOR)
        world.clock.advance(milliseconds=1)

    monkeypatch.setattr(world.edge, "issue_session", recorded)
    monkeypatch.setattr(world.edge, "knows_account", lambda _account: False)
    monkeypatch.setattr(world.service, "republish_account", change_lands)
    await world.service.login("ada@example.com", PASSWORD)
    assert issued[0] < world.store.users[account_id]["sessions_not_before"]


async def test_a_login_after_a_password_change_is_issued_no_earlier_than_the_change(world: World):
    """A replica whose clock is behind the one that changed the password does not issue a session
    that the change's sessions_not_before ends at once: the login takes it from the checked row."""
    account_id = await world.register()
    await world.service.change_password(account_id, PASSWORD, "a new password", audit=ACTOR)
    changed_at = world.store.users[account_id]["sessions_not_before"]
    world.clock.advance(seconds=-5)
    issued: list[datetime] = []
    issue = world.edge.issue_session
    world.edge.issue_session = lambda a, s, now, u: issued.append(now) or issue(a, s, now, u)  # type: ignore[method-assign]
    await world.service.login("ada@example.com", "a new password")
    assert issued == [changed_at]


async def test_login_rehashes_a_password_hashed_with_older_parameters(world: World):
    account_id = await world.register()
    old = world.store.users[account_id]["password_hash"]
    world.service.hasher = PasswordHasher(time_cost=2, memory_cost=8, parallelism=1)
    await world.service.login("ada@example.com", PASSWORD)
    new = world.store.users[account_id]["password_hash"]
    assert new != old and "t=2" in new
    await world.service.login("ada@example.com", PASSWORD)


async def test_logout_publishes_the_revoked_session_and_delivers_it(world: World):
    account_id = await world.register()
    await world.service.logout(account_id, account_id, "sid-1", audit=ACTOR)
    [event] = world.events("sessions.v1")
    assert event["session_id"] == "sid-1" and event["user_id"] == str(account_id)
    assert world.edge.delivered[-1].sessions[0].session_id == "sid-1"


async def test_a_password_change_ends_every_session_from_now(world: World):
    account_id = await world.register()
    world.clock.advance(minutes=5)
    await world.service.change_password(account_id, PASSWORD, "a new password", audit=ACTOR)
    user = world.events("users.v1")[-1]
    assert user["sessions_not_before"].startswith(world.clock.now.isoformat()[:19])
    await world.service.login("ada@example.com", "a new password")
    with pytest.raises(InvalidCredentials):
        await world.service.login("ada@example.com", PASSWORD)


async def test_a_password_change_refuses_a_wrong_current_or_an_unchanged_password(world: World):
    account_id = await world.register()
    with pytest.raises(WrongCurrentPassword) as wrong:
        await world.service.change_password(account_id, "not it", "a new password", audit=ACTOR)
    assert isinstance(wrong.value, Forbidden) and wrong.value.message == "The current password is wrong."
    with pytest.raises(Invalid) as same:
        await world.service.change_password(account_id, PASSWORD, PASSWORD, audit=ACTOR)
    assert same.value.details == [
        {"field": "new_password", "message": "must differ from the current password", "type": "value_error"}
    ]
    assert world.events("users.v1") == world.events("users.v1")[:1]  # only registration's


async def test_account_and_user_type(world: World):
    account_id = await world.register()
    assert (await world.service.account(account_id))["email"] == "ada@example.com"
    with pytest.raises(NotFound):
        await world.service.account(uuid4())
    row = await world.service.change_user_type(account_id, UserType.ENTERPRISE, audit=ACTOR)
    assert row["user_type"] == "enterprise"
    [changed] = world.events("billing.v1")
    assert changed["type"] == "user_type_changed" and changed["user_type"] == "enterprise"
    assert world.events("accounts.v1")[-1]["user_type"] == "enterprise"


async def test_an_enterprise_account_cannot_become_individual(world: World):
    account_id = await world.register()
    await world.service.change_user_type(account_id, UserType.ENTERPRISE, audit=ACTOR)
    await world.service.set_plan(account_id, Tier.ENTERPRISE, world.clock.now, 1)
    with pytest.raises(UserTypePlanMismatch) as caught:
        await world.service.change_user_type(account_id, UserType.INDIVIDUAL, audit=ACTOR)
    assert caught.value.code == ErrorCode.USER_TYPE_PLAN_MISMATCH


async def test_an_account_that_just_paid_for_enterprise_cannot_become_individual(world: World):
    """Billing puts a payment in force on the edge before it answers; keys' own copy of the plan
    (its billing.v1 consumer) may still say free: the newer of the two decides."""
    account_id = await world.register()
    await world.service.change_user_type(account_id, UserType.ENTERPRISE, audit=ACTOR)
    plan = catalogue()[Tier.ENTERPRISE]
    world.edge.plans[account_id] = PlanChanged(
        time=world.clock.now,
        account_id=account_id,
        plan=Tier.ENTERPRISE,
        quotas=plan.quotas,
        rate_limit=plan.rate_limit,
        version=1,
    )
    with pytest.raises(UserTypePlanMismatch):
        await world.service.change_user_type(account_id, UserType.INDIVIDUAL, audit=ACTOR)
    # and an older edge view does not override a newer downgrade keys has stored
    await world.service.set_plan(account_id, Tier.BASIC, world.clock.now, 2)
    row = await world.service.change_user_type(account_id, UserType.INDIVIDUAL, audit=ACTOR)
    assert row["user_type"] == "individual"


async def test_operator_roles_reach_the_account_its_user_and_every_live_key(world: World):
    account_id = await world.register()
    await world.service.create_key(account_id, account_id, "a", None, audit=ACTOR)
    await world.service.create_key(account_id, account_id, "b", None, audit=ACTOR)
    world.store.outbox.clear()
    row = await world.service.set_roles(account_id, [Role.VIEWER, Role.VIEWER], audit=OPERATOR)
    assert row["roles"] == ["viewer"]
    assert world.events("accounts.v1")[0]["roles"] == ["viewer"]
    assert world.events("users.v1")[0]["role"] == "viewer"
    assert [k["roles"] for k in world.events("keys.v1")] == [["viewer"], ["viewer"]]
    with pytest.raises(NotFound):
        await world.service.set_roles(uuid4(), [Role.OWNER], audit=OPERATOR)


# ---- API keys ---------------------------------------------------------------------------------
async def test_create_a_key_stores_only_its_hash_and_publishes_its_state(world: World):
    account_id = await world.register()
    row, secret = await world.service.create_key(account_id, account_id, "ci", None, audit=ACTOR)
    assert secret.startswith("sk-") and row["hash"] == hash_secret(secret) and secret not in str(world.store.keys)
    assert row["masked_key"] == f"sk-{secret[3:7]}...{secret[-4:]}"
    [state] = world.events("keys.v1")
    assert state["key_id"] == str(row["id"]) and state["hash"] == hash_secret(secret) and state["roles"] == ["owner"]
    assert secret not in json.dumps(state)
    assert world.edge.delivered[-1].keys[0].key_id == row["id"]


async def test_create_a_key_with_an_expiry_in_the_future_only(world: World):
    account_id = await world.register()
    later = world.clock.now + timedelta(days=1)
    row, _ = await world.service.create_key(account_id, account_id, "temp", later, audit=ACTOR)
    assert row["expires_at"] == later and world.events("keys.v1")[0]["expires_at"] is not None
    with pytest.raises(Invalid) as caught:
        await world.service.create_key(account_id, account_id, "past", world.clock.now, audit=ACTOR)
    assert caught.value.details[0]["field"] == "expires_at"


async def test_the_list_shows_enabled_disabled_and_expired(world: World):
    account_id = await world.register()
    on, _ = await world.service.create_key(account_id, account_id, "on", None, audit=ACTOR)
    world.clock.advance(seconds=1)
    off, _ = await world.service.create_key(account_id, account_id, "off", None, audit=ACTOR)
    world.clock.advance(seconds=1)
    soon, _ = await world.service.create_key(account_id, account_id, "soon", world.clock.now + timedelta(minutes=1), audit=ACTOR)
    await world.service.toggle(account_id, off["id"], audit=ACTOR)
    world.clock.advance(minutes=1)  # now == expires_at: expired
    listed = {r["name"]: r["status"] for r in await world.service.list_keys(account_id)}
    assert listed == {"on": KeyListStatus.ENABLED, "off": KeyListStatus.DISABLED, "soon": KeyListStatus.EXPIRED}
    assert world.store.keys[soon["id"]]["status"] == "enabled"  # expired is computed, never stored
    assert [r["id"] for r in await world.service.list_keys(account_id)] == [on["id"], off["id"], soon["id"]]


async def test_a_key_older_than_90_days_is_listed_as_rotation_due(world: World):
    account_id = await world.register()
    await world.service.create_key(account_id, account_id, "old", None, audit=ACTOR)
    world.clock.advance(days=90)
    assert [r["rotation_due"] for r in await world.service.list_keys(account_id)] == [False]  # exactly 90 days: not yet
    await world.service.create_key(account_id, account_id, "young", None, audit=ACTOR)
    world.clock.advance(seconds=1)
    listed = {r["name"]: r["rotation_due"] for r in await world.service.list_keys(account_id)}
    assert listed == {"old": True, "young": False}


async def test_toggle_flips_and_publishes(world: World):
    account_id = await world.register()
    row, _ = await world.service.create_key(account_id, account_id, "k", None, audit=ACTOR)
    assert (await world.service.toggle(account_id, row["id"], audit=ACTOR))["status"] == "disabled"
    assert (await world.service.toggle(account_id, row["id"], audit=ACTOR))["status"] == "enabled"
    assert [e["status"] for e in world.events("keys.v1")] == ["enabled", "disabled", "enabled"]


async def test_delete_publishes_the_deleted_state_and_a_tombstone(world: World):
    account_id = await world.register()
    row, _ = await world.service.create_key(account_id, account_id, "k", None, audit=ACTOR)
    await world.service.delete(account_id, row["id"], audit=ACTOR)
    assert await world.service.list_keys(account_id) == []
    assert world.events("keys.v1")[-2]["deleted"] is True and world.events("keys.v1")[-1] is None
    with pytest.raises(NotFound):
        await world.service.delete(account_id, row["id"], audit=ACTOR)


async def test_rotation_with_grace_keeps_the_old_key_until_then_and_the_sweep_deletes_it(world: World):
    account_id = await world.register()
    old, _ = await world.service.create_key(account_id, account_id, "prod", None, audit=ACTOR)
    new, secret = await world.service.rotate(account_id, old["id"], 60, audit=ACTOR)
    assert new["name"] == "prod" and new["expires_at"] is None and new["hash"] == hash_secret(secret)
    end = world.clock.now + timedelta(seconds=60)
    assert world.store.keys[old["id"]]["expires_at"] == end == world.store.keys[old["id"]]["delete_at"]
    await world.service.sweep_rotated()
    assert len(await world.service.list_keys(account_id)) == 2
    world.clock.advance(seconds=60)
    await world.service.sweep_rotated()
    assert [r["id"] for r in await world.service.list_keys(account_id)] == [new["id"]]
    assert world.events("keys.v1")[-2]["deleted"] is True and world.events("keys.v1")[-1] is None


async def test_rotation_with_no_grace_deletes_the_old_key_at_once(world: World):
    account_id = await world.register()
    old, _ = await world.service.create_key(account_id, account_id, "prod", None, audit=ACTOR)
    new, _ = await world.service.rotate(account_id, old["id"], 0, audit=ACTOR)
    assert [r["id"] for r in await world.service.list_keys(account_id)] == [new["id"]]
    states = world.events("keys.v1")
    assert states[1]["deleted"] is True and states[2] is None and states[3]["key_id"] == str(new["id"])


async def test_a_key_in_its_grace_period_cannot_be_rotated_again_only_its_successor(world: World):
    account_id = await world.register()
    old, _ = await world.service.create_key(account_id, account_id, "prod", None, audit=ACTOR)
    new, _ = await world.service.rotate(account_id, old["id"], 3600, audit=ACTOR)
    before = list(world.store.outbox)
    with pytest.raises(Conflict) as caught:
        await world.service.rotate(account_id, old["id"], 60, audit=ACTOR)
    assert caught.value.code == ErrorCode.CONFLICT and "already rotated" in caught.value.message
    # nothing written: no second successor, the old key's grace unchanged, no audit entry
    assert world.store.outbox == before
    listed = await world.service.list_keys(account_id)
    assert {r["id"]: r["rotated"] for r in listed} == {old["id"]: True, new["id"]: False}  # the console's hint
    assert world.store.keys[old["id"]]["delete_at"] == world.clock.now + timedelta(seconds=3600)
    # the successor is the one to rotate: one permanent key remains
    newest, _ = await world.service.rotate(account_id, new["id"], 60, audit=ACTOR)
    permanent = [r["id"] for r in await world.service.list_keys(account_id) if r["expires_at"] is None]
    assert permanent == [newest["id"]]


async def test_another_accounts_key_is_not_found_for_every_write(world: World):
    mine = await world.register("a@example.com")
    theirs = await world.register("b@example.com")
    row, _ = await world.service.create_key(theirs, theirs, "theirs", None, audit=ACTOR)
    before = list(world.store.outbox)
    for call in (
        world.service.toggle(mine, row["id"], audit=ACTOR),
        world.service.delete(mine, row["id"], audit=ACTOR),
        world.service.rotate(mine, row["id"], 60, audit=ACTOR),
    ):
        with pytest.raises(NotFound) as caught:
            await call
        assert caught.value.message == "The API key does not exist."
    assert world.store.outbox == before and await world.service.list_keys(mine) == []


async def test_calls_move_last_used_at_forward_only(world: World):
    account_id = await world.register()
    row, _ = await world.service.create_key(account_id, account_id, "k", None, audit=ACTOR)
    later = world.clock.now + timedelta(minutes=1)
    await world.service.note_calls({row["id"]: later})
    await world.service.note_calls({row["id"]: world.clock.now})
    assert world.store.keys[row["id"]]["last_used_at"] == later


# ---- service tokens ---------------------------------------------------------------------------
async def test_service_tokens_create_list_revoke(world: World):
    row, token = await world.service.create_service_token(
        "gateway", [ServiceScope.USAGE_WRITE, ServiceScope.USAGE_WRITE], audit=ACTOR
    )
    assert token.startswith("st-") and row["hash"] == hash_secret(token) and row["scopes"] == ["usage:write"]
    [state] = world.events("service-tokens.v1")
    assert state["hash"] == hash_secret(token) and state["revoked"] is False and token not in json.dumps(state)
    assert [t["id"] for t in await world.service.list_service_tokens()] == [row["id"]]
    await world.service.revoke_service_token(row["id"], audit=ACTOR)
    assert world.events("service-tokens.v1")[-2]["revoked"] is True and world.events("service-tokens.v1")[-1] is None
    assert world.edge.delivered[-1].service_tokens[0].revoked is True
    listed = await world.service.list_service_tokens()
    assert listed[0]["revoked_at"] == world.clock.now
    with pytest.raises(NotFound) as caught:
        await world.service.revoke_service_token(uuid4(), audit=ACTOR)
    assert caught.value.message == "The service token does not exist."


async def test_service_token_uses_are_written_and_kept_when_the_write_fails(world: World):
    row, _ = await world.service.create_service_token("gateway", [ServiceScope.USAGE_WRITE], audit=ACTOR)
    world.edge.note_service_token_use(row["id"], world.clock.now)
    await world.service.write_service_token_uses()
    assert world.store.tokens[row["id"]]["last_used_at"] == world.clock.now

    async def broken(used: dict) -> None:
        raise OSError("database down")

    world.store.touch_service_tokens = broken  # type: ignore[method-assign]
    world.edge.note_service_token_use(row["id"], world.clock.now + timedelta(seconds=1))
    with pytest.raises(OSError):
        await world.service.write_service_token_uses()
    assert world.edge.uses == {row["id"]: world.clock.now + timedelta(seconds=1)}  # kept for the next try


# ---- every state change writes its outbox event ----------------------------------------------
async def test_every_state_change_writes_its_outbox_event(world: World):
    account_id = await world.register()
    key, _ = await world.service.create_key(account_id, account_id, "k", None, audit=ACTOR)
    token, _ = await world.service.create_service_token("gw", [ServiceScope.USAGE_WRITE], audit=ACTOR)
    changes = {
        "register": (lambda: world.register("other@example.com"), "accounts.v1"),
        "logout": (lambda: world.service.logout(account_id, account_id, "s", audit=ACTOR), "sessions.v1"),
        "password": (lambda: world.service.change_password(account_id, PASSWORD, "a new password", audit=ACTOR), "users.v1"),
        "user type": (lambda: world.service.change_user_type(account_id, UserType.ENTERPRISE, audit=ACTOR), "billing.v1"),
        "roles": (lambda: world.service.set_roles(account_id, [Role.OWNER], audit=OPERATOR), "accounts.v1"),
        "create": (lambda: world.service.create_key(account_id, account_id, "k2", None, audit=ACTOR), "keys.v1"),
        "toggle": (lambda: world.service.toggle(account_id, key["id"], audit=ACTOR), "keys.v1"),
        "rotate": (lambda: world.service.rotate(account_id, key["id"], 0, audit=ACTOR), "keys.v1"),
        "token": (
            lambda: world.service.create_service_token("gw2", [ServiceScope.USAGE_WRITE], audit=ACTOR),
            "service-tokens.v1",
        ),
        "revoke": (lambda: world.service.revoke_service_token(token["id"], audit=ACTOR), "service-tokens.v1"),
    }
    for name, (call, topic) in changes.items():
        before = len(world.events(topic))
        deliveries = len(world.edge.delivered)
        await call()
        assert len(world.events(topic)) > before, name
        assert len(world.edge.delivered) == deliveries + 1, name  # delivered before answering
    new_key = (await world.service.list_keys(account_id))[0]
    before = len(world.events("keys.v1"))
    await world.service.delete(account_id, new_key["id"], audit=ACTOR)
    assert len(world.events("keys.v1")) == before + 2


# ---- members (v2) -----------------------------------------------------------------------------
async def test_members_add_list_change_role_remove(world: World):
    account_id = await world.register()
    world.clock.advance(seconds=1)
    dev = await world.service.add_member(account_id, "Dev@Example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    assert dev["email"] == "dev@example.com" and dev["role"] == "developer" and dev["account_id"] == account_id
    assert world.events("users.v1")[-1] == {**world.events("users.v1")[-1], "user_id": str(dev["id"]), "role": "developer"}
    assert [m["role"] for m in await world.service.list_members(account_id)] == ["owner", "developer"]
    token, _ = await world.service.login("dev@example.com", "dev password")
    assert token.startswith(f"tg1.{account_id}.{dev['id']}.")
    key, _ = await world.service.create_key(account_id, dev["id"], "dev key", None, audit=ACTOR)
    assert world.events("keys.v1")[-1]["roles"] == ["developer"] and world.events("keys.v1")[-1]["created_by"] == str(dev["id"])

    changed = await world.service.change_member_role(account_id, dev["id"], Role.VIEWER, audit=ACTOR)
    assert changed["role"] == "viewer" and world.events("users.v1")[-1]["role"] == "viewer"
    assert world.events("keys.v1")[-1]["roles"] == ["viewer"]  # its keys act with its current role

    await world.service.remove_member(account_id, dev["id"], audit=ACTOR)
    user = world.events("users.v1")[-1]
    assert user["removed"] is True and user["sessions_not_before"] is not None
    assert world.events("keys.v1")[-2]["deleted"] is True and world.events("keys.v1")[-1] is None
    assert key["id"] not in [k["id"] for k in await world.service.list_keys(account_id)]
    assert [m["role"] for m in await world.service.list_members(account_id)] == ["owner"]
    with pytest.raises(InvalidCredentials):
        await world.service.login("dev@example.com", "dev password")


async def test_a_taken_email_is_a_conflict_for_members_and_accounts(world: World):
    account_id = await world.register()
    with pytest.raises(Conflict) as caught:
        await world.service.add_member(account_id, "ADA@example.com", "Ada 2", "a password", Role.VIEWER, audit=ACTOR)
    assert caught.value.code == ErrorCode.CONFLICT
    await world.service.add_member(account_id, "bob@example.com", "Bob", "a password", Role.VIEWER, audit=ACTOR)
    with pytest.raises(EmailTaken):
        await world.register("bob@example.com")
    assert len(world.store.accounts) == 1  # the account of the refused registration rolled back


async def test_the_last_owner_can_be_neither_demoted_nor_removed(world: World):
    account_id = await world.register()
    for call in (
        lambda: world.service.change_member_role(account_id, account_id, Role.DEVELOPER, audit=ACTOR),
        lambda: world.service.remove_member(account_id, account_id, audit=ACTOR),
    ):
        with pytest.raises(Conflict) as caught:
            await call()
        assert caught.value.code == ErrorCode.LAST_OWNER
    second = await world.service.add_member(account_id, "own2@example.com", "Own 2", "a password", Role.OWNER, audit=ACTOR)
    await world.service.change_member_role(account_id, account_id, Role.DEVELOPER, audit=ACTOR)  # another owner remains
    with pytest.raises(Conflict):
        await world.service.remove_member(account_id, second["id"], audit=ACTOR)


async def test_another_accounts_member_is_not_found(world: World):
    mine = await world.register("a@example.com")
    theirs = await world.register("b@example.com")
    member = await world.service.add_member(theirs, "m@example.com", "M", "a password", Role.VIEWER, audit=ACTOR)
    for call in (
        lambda: world.service.change_member_role(mine, member["id"], Role.OWNER, audit=ACTOR),
        lambda: world.service.remove_member(mine, member["id"], audit=ACTOR),
    ):
        with pytest.raises(NotFound) as caught:
            await call()
        assert caught.value.message == "The member does not exist."
    assert world.store.users[member["id"]]["role"] == "viewer"


async def test_a_developer_writes_only_the_keys_it_created(world: World):
    account_id = await world.register()
    dev = await world.service.add_member(account_id, "dev@example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    owners, _ = await world.service.create_key(account_id, account_id, "owner's", None, audit=ACTOR)
    own, _ = await world.service.create_key(account_id, dev["id"], "dev's", None, audit=ACTOR)
    for call in (
        lambda: world.service.toggle(account_id, owners["id"], only_own=dev["id"], audit=ACTOR),
        lambda: world.service.delete(account_id, owners["id"], only_own=dev["id"], audit=ACTOR),
        lambda: world.service.rotate(account_id, owners["id"], 0, only_own=dev["id"], audit=ACTOR),
    ):
        with pytest.raises(Forbidden):
            await call()
    assert (await world.service.toggle(account_id, own["id"], only_own=dev["id"], audit=ACTOR))["status"] == "disabled"
    await world.service.toggle(account_id, own["id"], audit=ACTOR)  # the owner writes every key


async def test_get_account_answers_for_the_calling_user(world: World):
    account_id = await world.register()
    dev = await world.service.add_member(account_id, "dev@example.com", "Dev", "dev password", Role.DEVELOPER, audit=ACTOR)
    mine = await world.service.account(account_id, dev["id"])
    assert mine["role"] == "developer" and mine["roles"] == ["developer"]
    assert (await world.service.account(account_id, account_id))["roles"] == ["owner"]


def test_the_role_permission_table_is_api_mds():
    from contracts.common import ROLE_PERMISSIONS, Permission

    reads = {p for p in Permission if p.value.endswith(":read")}
    assert ROLE_PERMISSIONS[Role.OWNER] == set(Permission)
    assert ROLE_PERMISSIONS[Role.DEVELOPER] == {
        Permission.KEYS_WRITE,
        Permission.USAGE_READ,
        Permission.QUOTA_READ,
        Permission.ALERTS_READ,
        Permission.ALERTS_WRITE,
        Permission.ACTIVITY_READ,
        Permission.PROJECTS_READ,
        Permission.PROJECTS_WRITE,
        Permission.BILLING_READ,
    }
    assert ROLE_PERMISSIONS[Role.BILLING] == reads | {Permission.BILLING_WRITE}
    assert (
        Permission.AUDIT_READ in ROLE_PERMISSIONS[Role.BILLING] and Permission.MEMBERS_WRITE not in ROLE_PERMISSIONS[Role.BILLING]
    )
    assert ROLE_PERMISSIONS[Role.VIEWER] == reads - {Permission.AUDIT_READ}
    assert all(Permission.MEMBERS_WRITE not in ROLE_PERMISSIONS[r] for r in Role if r != Role.OWNER)
