"""Ends as strict as a key's toggle (docs/architecture.md, "Strict ends of sessions, users and service
tokens"): a logout, a password change, a member's removal, a role change (for the member's keys
and sessions) and a service token's revocation are in force on a replica cut off from Kafka.
Two platforms in this process share Kafka, Postgres and Redis; B's follower is stopped once B has
learnt the credentials, so only what A shared in Redis can refuse them on B."""

import hashlib
import time
import uuid
from typing import Any

import httpx
import pytest

from contracts.common import ServiceScope
from contracts.rate_limit import RateLimit
from services.edge.leases import LEASE_S
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import Limits
from services.edge.rate_store import KeyCheck, KeyRevoked, RedisStore
from services.keys import operator_cli
from tests.integration.test_edge_rate_limit import publish_plan
from tests.integration.test_edge_verify import service_token
from tests.integration.test_keys_api import PASSWORD, bearer, code, new_key, signup
from tests.integration.test_members import add, login
from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.service_tokens import ADMIN_PATH, admin_headers

pytestmark = pytest.mark.integration
MEMBERS = "/api/account/members"
GEO = "/api/geo/projects"
VERIFY = "/api/edge/verify"
ROOMY = Limits(per_second=100_000.0, burst=100_000, per_minute=10_000_000)


def _answer(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, "ok" if response.status_code < 300 else code(response)


async def _knows_user(edge: Any, user_id: str, role: str) -> bool:
    state = edge.users.get(uuid.UUID(user_id))
    return state is not None and state.role.value == role


async def _knows_key(edge: Any, secret: str) -> bool:
    return edge.keys.get(hashlib.sha256(secret.encode()).hexdigest()) is not None


async def test_a_replica_cut_off_from_kafka_refuses_a_logged_out_session(settings):
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        account, owner = await signup(a)
        other = await login(a, account["email"])
        await wait_until(lambda: _knows_user(edge_b, account["id"], "owner"), timeout=20, interval=0.02)
        for session in (owner, other):
            assert _answer(await b.get("/api/account", headers=session)) == (200, "ok")

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        assert (await a.post("/api/auth/logout", headers=owner)).status_code == 204
        assert _answer(await b.get("/api/account", headers=owner)) == (401, "invalid_session")
        assert _answer(await b.get("/api/account", headers=other)) == (200, "ok")  # only that session


async def test_a_replica_cut_off_from_kafka_refuses_the_sessions_a_password_change_ended(settings):
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        account, owner = await signup(a)
        other = await login(a, account["email"])
        await wait_until(lambda: _knows_user(edge_b, account["id"], "owner"), timeout=20, interval=0.02)
        for session in (owner, other):
            assert _answer(await b.get("/api/account", headers=session)) == (200, "ok")

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        changed = await a.put(
            "/api/account/password",
            json={"current_password": PASSWORD, "new_password": "another good passphrase"},
            headers=owner,
        )
        assert changed.status_code == 204, changed.text
        for session in (owner, other):  # every session of the user, the one that changed it too
            assert _answer(await b.get("/api/account", headers=session)) == (401, "invalid_session")
        fresh = await a.post("/api/auth/login", json={"email": account["email"], "password": "another good passphrase"})
        assert _answer(await b.get("/api/account", headers=bearer(fresh.json()["access_token"]))) == (200, "ok")


async def test_a_replica_cut_off_from_kafka_refuses_a_removed_members_key_and_session(settings):
    """(The key was strict already: a removal deletes it, and a DELETE is shared in Redis. The
    session was not.)"""
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        _, owner = await signup(a)
        member = await add(a, owner, "developer")
        session = await login(a, member["email"])
        key = await new_key(a, session)
        await wait_until(lambda: _knows_key(edge_b, key["key"]), timeout=20, interval=0.02)
        await wait_until(lambda: _knows_user(edge_b, member["id"], "developer"), timeout=20, interval=0.02)
        assert _answer(await b.get(GEO, headers=bearer(key["key"]))) == (200, "ok")
        assert _answer(await b.get("/api/account", headers=session)) == (200, "ok")

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        assert (await a.delete(f"{MEMBERS}/{member['id']}", headers=owner)).status_code == 204
        assert _answer(await b.get("/api/account", headers=session)) == (401, "invalid_session")
        assert _answer(await b.get(GEO, headers=bearer(key["key"]))) == (401, "invalid_api_key")


async def test_a_replica_cut_off_from_kafka_does_not_let_a_downgraded_members_key_or_session_act_with_the_older_role(settings):
    """A developer's key may write projects; once A answered its user's change to viewer, B (still
    holding the developer state) admits none of the key's calls nor the session's (503, retry)
    rather than judge them by the older role; with the new state it answers as a viewer's."""
    async with running_app(settings) as (app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        account, owner = await signup(a)
        await publish_plan(settings, uuid.UUID(account["id"]), RateLimit(per_second=1000, burst=1000, per_minute=100_000))
        member = await add(a, owner, "developer")
        session = await login(a, member["email"])
        key = await new_key(a, session)
        verifier = bearer(await service_token(a, settings, ["keys:verify"]))
        await wait_until(lambda: _knows_key(edge_b, key["key"]), timeout=20, interval=0.02)
        await wait_until(lambda: _knows_user(edge_b, member["id"], "developer"), timeout=20, interval=0.02)
        await wait_until(lambda: _has_tokens(edge_b), timeout=20, interval=0.02)
        writes = {"key": key["key"], "method": "POST", "path": GEO, "ip": "203.0.113.5", "permission": "projects:write"}

        async def verdict() -> str:
            answer = await b.post(VERIFY, json=writes, headers=verifier)
            assert answer.status_code == 200, answer.text
            return "valid" if answer.json()["valid"] else str(answer.json()["code"])

        assert await verdict() == "valid"
        assert _answer(await b.get(MEMBERS, headers=session)) == (200, "ok")

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        changed = await a.put(f"{MEMBERS}/{member['id']}/role", json={"role": "viewer"}, headers=owner)
        assert changed.status_code == 200, changed.text
        assert await verdict() == "service_unavailable"  # never "valid" by the developer's role
        refused = await b.get(GEO, headers=bearer(key["key"]))
        assert (_answer(refused), refused.headers["retry-after"]) == ((503, "service_unavailable"), "1")
        assert _answer(await b.get(MEMBERS, headers=session)) == (503, "service_unavailable")

        edge_b.users.apply(app_a.state.runtime.edge.users.get(uuid.UUID(member["id"])))  # what users.v1 would bring
        assert await verdict() == "permission_denied"
        assert _answer(await b.get(GEO, headers=bearer(key["key"]))) == (200, "ok")  # a viewer reads
        assert _answer(await b.get(MEMBERS, headers=session)) == (200, "ok")


async def test_a_replica_cut_off_from_kafka_refuses_a_revoked_service_token_within_1_s(settings):
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        _, owner = await signup(a)
        key = await new_key(a, owner)
        scopes = ["keys:verify", "usage:write"]
        made = await a.post(ADMIN_PATH, json={"name": "gateway", "scopes": scopes}, headers=admin_headers(settings))
        assert made.status_code == 201, made.text
        token = bearer(made.json()["token"])
        digest = hashlib.sha256(made.json()["token"].encode()).hexdigest()
        await wait_until(lambda: _knows_token(edge_b, digest), timeout=20, interval=0.02)
        await wait_until(lambda: _knows_key(edge_b, key["key"]), timeout=20, interval=0.02)
        body = {"key": key["key"], "method": "POST", "path": "/v1/chat", "ip": "203.0.113.5"}
        assert (await b.post(VERIFY, json=body, headers=token)).json()["valid"] is True

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        revoked = await a.delete(f"{ADMIN_PATH}/{made.json()['id']}", headers=admin_headers(settings))
        assert revoked.status_code == 204
        answered = time.perf_counter()
        await wait_until(lambda: _refused(b, body, token), timeout=1.0, interval=0.005)
        lag_ms = (time.perf_counter() - answered) * 1000
        assert edge_b.service_tokens.get(digest) is not None  # B's projection still holds it live
        refused = await b.post(VERIFY, json=body, headers=token)
        assert _answer(refused) == (401, "invalid_service_token")
        # every service route: usage's too (its dependency answers before the body is read)
        assert _answer(await b.post("/api/usage/events", json={}, headers=token)) == (401, "invalid_service_token")
        print(f"a revoked token refused on the cut-off replica {lag_ms:.1f} ms after the revocation answered")


async def test_the_clis_revocation_is_refused_by_a_replica_cut_off_from_kafka_too(settings):
    """`tollgate service-token revoke` runs in a process without an edge: it shares the revocation
    in Redis itself (REDIS_URL)."""
    async with running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        created = await operator_cli.create(settings, "gateway", [ServiceScope.USAGE_WRITE])
        digest = hashlib.sha256(created["token"].encode()).hexdigest()
        await wait_until(lambda: _knows_token(edge_b, digest), timeout=20, interval=0.02)
        token = bearer(created["token"])
        assert _answer(await b.post("/api/usage/events", json={}, headers=token))[0] == 422  # live: the body is judged

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        await operator_cli.revoke(settings, uuid.UUID(created["id"]))

        async def refused() -> bool:
            return _answer(await b.post("/api/usage/events", json={}, headers=token)) == (401, "invalid_service_token")

        await wait_until(refused, timeout=1.0, interval=0.005)


async def _refused(client: httpx.AsyncClient, body: dict[str, str], token: dict[str, str]) -> bool:
    answer = await client.post(VERIFY, json=body, headers=token)
    if answer.status_code == 200:
        return False
    assert _answer(answer) == (401, "invalid_service_token"), answer.text
    return True


async def _knows_token(edge: Any, digest: str) -> bool:
    return edge.service_tokens.get(digest) is not None


async def _has_tokens(edge: Any) -> bool:
    return len(edge.service_tokens) > 0


class _Replica:
    """One replica's RedisStore (on a prefix of the test's own) and one key of a member, as the
    edge asks about it: the key's state at version 1, its user's at `user_version`."""

    def __init__(self, url: str, prefix: str, account: uuid.UUID, key: uuid.UUID, user: uuid.UUID) -> None:
        self.store = RedisStore(url, prefix, prefix, f"{prefix}revoked:", users_prefix=f"{prefix}user:")
        self.subjects = (f"a:{account}", f"k:{key}")
        self.view = CallsView(account, "2026-03", None, 0, 0, 1_000_000)
        self.key, self.user = key, user

    async def call(self, user_version: int) -> int | None:
        _, taken = await self.store.hit_and_admit_all(
            self.subjects, ROOMY, time.time(), (self.view,), KeyCheck(self.key, 1, self.user, user_version)
        )
        return taken


async def test_a_role_change_answers_once_the_members_key_leases_are_dropped_and_then_no_lease_serves_it(redis_url):
    """A replica holds a lease of a member's busy key, taken with the member's users.v1 state at
    version 4. The role change (version 5) answers once that lease is dropped (milliseconds); then
    the replica's calls judged by version 4 are refused (role: 503), and those by 5 admitted."""
    prefix, account, key, user = f"t{uuid.uuid4().hex[:8]}:", uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    holder, keys_service = (_Replica(redis_url, prefix, account, key, user) for _ in range(2))
    try:
        holder.store._lease_holder._demand[holder.subjects] = 19  # the next call takes a block of 20
        assert await holder.call(4) == 0
        assert sum(h.lease.left for h in holder.store._lease_holder._leases.values()) == 19
        started = time.monotonic()
        await keys_service.store.users.change(user, 5, "role", [key])
        assert time.monotonic() - started < LEASE_S / 4  # dropped on the announcement, not expired
        assert not holder.store._lease_holder._leases
        with pytest.raises(KeyRevoked) as refused:
            await holder.call(4)
        assert refused.value.how == "role" and refused.value.narrowed
        assert await holder.call(5) == 0
        await keys_service.store.users.change(user, 6, "removed", [])
        with pytest.raises(KeyRevoked) as gone:
            await holder.call(5)
        assert gone.value.deleted
        await keys_service.store.users.change(user, 5, "role", [])  # an older change never undoes a newer one
        with pytest.raises(KeyRevoked):
            await holder.call(5)
    finally:
        await holder.store.close()
        await keys_service.store.close()
