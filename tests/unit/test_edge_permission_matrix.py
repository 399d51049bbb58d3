"""The edge's half of the permission matrix, without I/O: every way a route can declare what it
needs (`requires(permission)`, `requires(permission, console_only=True)`, `requires_service(scope)`,
`requires_operator()`, and verify's `verifier_of`), for every permission and scope, x every kind of caller (none, a session and
an API key of each role, a service token of each scope, the operator's token, and credentials
that died: a disabled and a deleted key, a logged-out session, a removed member's key and
session, a revoked token), each answer
derived from the contract's words (tests/support/permission_contract.py), not from the code's role
table. The edge is fed by hand (users.v1, keys.v1, service-tokens.v1). Each API-key cell is asked
twice: the route's dependency judges the first call, the screen the second (its route is known)."""

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from contracts.common import Permission, Role, ServiceScope, Tier, UserType
from contracts.credentials import hash_secret
from contracts.events import AccountState, KeyState, PlanChanged, ServiceTokenState, SessionRevoked, UserState
from contracts.plans import catalogue
from services.edge.calls import CallRecorder
from services.edge.edge import Edge
from services.edge.errors import install_error_handlers
from services.edge.middleware import RequestMiddleware
from services.edge.screen import RefusalScreen
from services.edge.verify_api import verifier_of
from services.runtime.platform.settings import Settings
from tests.support.permission_contract import CALLERS, DEAD_CALLERS, READS, ROLES, SCOPES, WRITES, Access, Caller, answer

NOW = datetime.now(UTC)
ACCOUNT = uuid.uuid4()
ADMIN = "admin-token-of-the-operator"
USERS = {role: ACCOUNT if role == "owner" else uuid.uuid4() for role in ROLES}  # the owner registered the account
KEYS = {role: "sk-" + role[0] * 43 for role in ROLES}
TOKENS = {scope: "st-" + scope[0] * 43 for scope in SCOPES}
PERMISSIONS = sorted(READS | WRITES)
DEAD = {"disabled": "sk-" + "x" * 43, "deleted": "sk-" + "y" * 43, "removed_key": "sk-" + "w" * 43, "revoked": "st-" + "z" * 43}
REMOVED = uuid.uuid4()  # a developer removed from the account
LOGGED_OUT = uuid.uuid4().hex  # the session id of the owner's session that logged out
ACCESSES: list[Access] = [
    Access("customer"),
    Access("console"),
    *(Access(kind, p) for p in PERMISSIONS for kind in ("customer", "console")),  # type: ignore[arg-type]
    *(Access("service", scope) for scope in SCOPES),
    Access("operator"),
]


def _path(access: Access) -> str:
    return f"/{access.kind}/{access.need or 'any'}"


def _app(edge: Edge) -> FastAPI:
    """One route per way of declaring a need, each answering 204 when let through."""
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(RefusalScreen, edge=edge)
    app.add_middleware(RequestMiddleware)
    for access in ACCESSES:
        if access.kind == "service":  # keys:verify: as verify declares it (its missing token is its own)
            scope = ServiceScope(access.need)
            dependency: Any = verifier_of(edge) if scope is ServiceScope.KEYS_VERIFY else edge.requires_service(scope)
        elif access.kind == "operator":
            dependency = edge.requires_operator()
        else:
            permission = Permission(access.need) if access.need else None
            dependency = edge.requires(permission, console_only=access.kind == "console")

        async def endpoint(_: Annotated[Any, Depends(dependency)]) -> None:
            return None

        app.add_api_route(_path(access), endpoint, methods=["GET"], status_code=204)
    return app


@pytest.fixture(scope="module")
def served() -> tuple[Edge, TestClient]:
    settings = Settings(
        kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s", admin_token=ADMIN
    )
    edge = Edge(settings)
    edge.calls = CallRecorder(settings)  # not started: the calls stay in its lanes
    edge.assume_caught_up()
    edge.accounts.apply(AccountState(time=NOW, account_id=ACCOUNT, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL))
    enterprise = catalogue()[Tier.ENTERPRISE]  # room in the rate limits for every key's cells
    edge.apply_billing(
        PlanChanged(
            time=NOW, account_id=ACCOUNT, plan=Tier.ENTERPRISE, quotas=enterprise.quotas, rate_limit=enterprise.rate_limit
        )
    )
    for role, user_id in USERS.items():
        edge.users.apply(UserState(time=NOW, account_id=ACCOUNT, user_id=user_id, role=Role(role)))
        key = KeyState(
            time=NOW,
            account_id=ACCOUNT,
            key_id=uuid.uuid4(),
            hash=hash_secret(KEYS[role]),
            status="enabled",
            roles=[Role.OWNER],  # keys.v1's word; the creator's users.v1 role is what decides
            created_by=user_id,
        )
        edge.keys.apply(key)
    for scope, token in TOKENS.items():
        state = ServiceTokenState(
            time=NOW, token_id=uuid.uuid4(), name=scope, hash=hash_secret(token), scopes=[ServiceScope(scope)]
        )
        edge.service_tokens.apply(state)
    # credentials that died: the owner's keys disabled and deleted, a session logged out, a revoked token
    for dead, changes in (("disabled", {"status": "disabled"}), ("deleted", {"deleted": True})):
        edge.keys.apply(
            KeyState(time=NOW, account_id=ACCOUNT, key_id=uuid.uuid4(), hash=hash_secret(DEAD[dead]), status="enabled",
                     roles=[Role.OWNER], created_by=ACCOUNT).model_copy(update=changes)
        )  # fmt: skip
    edge.users.apply(UserState(time=NOW, account_id=ACCOUNT, user_id=REMOVED, role=Role.DEVELOPER, removed=True))
    edge.keys.apply(
        KeyState(time=NOW, account_id=ACCOUNT, key_id=uuid.uuid4(), hash=hash_secret(DEAD["removed_key"]), status="enabled",
                 roles=[Role.DEVELOPER], created_by=REMOVED)
    )  # fmt: skip
    edge.revoked_sessions.apply(SessionRevoked(time=NOW, account_id=ACCOUNT, session_id=LOGGED_OUT, user_id=ACCOUNT,
                                               revoked_at=NOW), NOW)  # fmt: skip
    revoked = ServiceTokenState(time=NOW, token_id=uuid.uuid4(), name="gone", hash=hash_secret(DEAD["revoked"]),
                                scopes=[ServiceScope(s) for s in SCOPES], revoked=True)  # fmt: skip
    edge.service_tokens.apply(revoked)
    return edge, TestClient(_app(edge), raise_server_exceptions=False)


def _headers(edge: Edge, caller: Caller) -> dict[str, str]:
    if caller.kind == "none":
        return {}
    if caller.dead == "logged_out":
        return {"Authorization": f"Bearer {edge.issue_session(ACCOUNT, LOGGED_OUT, NOW, ACCOUNT)}"}
    if caller.dead == "removed_session":  # issued before the removal
        return {"Authorization": f"Bearer {edge.issue_session(ACCOUNT, uuid.uuid4().hex, NOW, REMOVED)}"}
    if caller.dead:
        return {"Authorization": f"Bearer {DEAD[caller.dead]}"}
    if caller.kind == "admin":
        token = ADMIN
    elif caller.kind == "service":
        (scope,) = caller.scopes
        token = TOKENS[scope]
    elif caller.kind == "key":
        assert caller.role is not None
        token = KEYS[caller.role]
    else:
        assert caller.role is not None
        token = edge.issue_session(ACCOUNT, uuid.uuid4().hex, datetime.now(UTC), USERS[caller.role])
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("access", ACCESSES, ids=_path)
def test_every_caller_gets_the_contracts_answer(served: tuple[Edge, TestClient], access: Access) -> None:
    edge, http = served
    wrong = []
    for caller in (*CALLERS, *DEAD_CALLERS):
        want = answer(access, caller, 204)
        for turn in ("dependency", "screen") if caller.kind == "key" else ("dependency",):
            response = http.get(_path(access), headers=_headers(edge, caller))
            code = response.json()["error"]["code"] if response.status_code >= 400 else None
            if (response.status_code, code) != want:
                wrong.append(f"{caller.name} ({turn}): expected {want}, got ({response.status_code}, {code!r})")
    assert not wrong, "\n".join(wrong)


def test_the_contracts_role_table_is_the_codes() -> None:
    """The words the matrices judge by and contracts/common.py's table say the same."""
    from contracts.common import ROLE_PERMISSIONS

    assert {role.value: {p.value for p in granted} for role, granted in ROLE_PERMISSIONS.items()} == ROLES
    assert {p.value for p in Permission} == READS | WRITES and {s.value for s in ServiceScope} == set(SCOPES)
