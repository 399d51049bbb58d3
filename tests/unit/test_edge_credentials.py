"""Whom the edge lets act, and with which roles, when its projections lack a user's users.v1 state
or have not read their topics to the end yet (issue #41, item 1). The edge is fed by hand: no I/O."""

import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from contracts.common import Permission, Role, ServiceScope, UserType
from contracts.credentials import hash_secret
from contracts.events import AccountState, KeyState, ServiceTokenState, UserState
from services.edge.calls import CallRecorder
from services.edge.edge import Edge, acting_roles
from services.edge.errors import install_error_handlers
from services.edge.middleware import RequestMiddleware
from services.edge.principal import Principal
from services.edge.screen import RefusalScreen
from services.edge.service_tokens import ServicePrincipal
from services.runtime.platform.settings import Settings

NOW = datetime.now(UTC)
ACCOUNT, MEMBER = uuid.uuid4(), uuid.uuid4()
MEMBERS_KEY, OWNERS_KEY, LEGACY_KEY = ("sk-" + c * 43 for c in "mol")
SERVICE_TOKEN = "st-" + "s" * 43


def _user(user_id: uuid.UUID, role: Role, *, removed: bool = False) -> UserState:
    return UserState(time=datetime.now(UTC), account_id=ACCOUNT, user_id=user_id, role=role, removed=removed)


def _key(secret: str, created_by: uuid.UUID | None) -> KeyState:
    return KeyState(
        time=NOW,
        account_id=ACCOUNT,
        key_id=uuid.uuid4(),
        hash=hash_secret(secret),
        status="enabled",
        roles=[Role.OWNER],  # what keys.v1 says: never what decides for a member's key
        created_by=created_by,
    )


class Served:
    """An edge that knows the account (accounts.v1 roles [owner]) and three keys: a member's, one
    the registering user created, and one from before members (no creator)."""

    def __init__(self, *, caught_up: bool = True) -> None:
        settings = Settings(
            kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s", admin_token="adm"
        )
        self.edge = edge = Edge(settings)
        edge.calls = CallRecorder(settings)  # not started: the calls stay in its lanes
        if caught_up:
            edge.assume_caught_up()
        edge.accounts.apply(AccountState(time=NOW, account_id=ACCOUNT, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL))
        for secret, creator in ((MEMBERS_KEY, MEMBER), (OWNERS_KEY, ACCOUNT), (LEGACY_KEY, None)):
            edge.keys.apply(_key(secret, creator))
        edge.service_tokens.apply(
            ServiceTokenState(
                time=NOW, token_id=uuid.uuid4(), name="gw", hash=hash_secret(SERVICE_TOKEN), scopes=[ServiceScope.USAGE_WRITE]
            )
        )
        app = FastAPI()
        install_error_handlers(app)
        app.add_middleware(RefusalScreen, edge=edge)
        app.add_middleware(RequestMiddleware)

        @app.get("/roles")
        async def roles(principal: Annotated[Principal, Depends(edge.requires())]) -> list[str]:
            return sorted(principal.roles)

        @app.get("/projects")
        async def projects(principal: Annotated[Principal, Depends(edge.requires(Permission.PROJECTS_READ))]) -> None:
            return None

        @app.put("/members")
        async def members(
            principal: Annotated[Principal, Depends(edge.requires(Permission.MEMBERS_WRITE, console_only=True))],
        ) -> None:
            return None

        @app.post("/usage")
        async def usage(service: Annotated[ServicePrincipal, Depends(edge.requires_service(ServiceScope.USAGE_WRITE))]) -> None:
            return None

        @app.get("/admin")
        async def admin(_: Annotated[None, Depends(edge.requires_operator())]) -> None:
            return None

        self.http = TestClient(app, raise_server_exceptions=False)

    def session(self, user_id: uuid.UUID) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.edge.issue_session(ACCOUNT, uuid.uuid4().hex, datetime.now(UTC), user_id)}"}


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_acting_roles_fall_back_to_the_accounts_only_for_its_registering_user():
    viewer = _user(MEMBER, Role.VIEWER)
    assert acting_roles(viewer, MEMBER, ACCOUNT, [Role.OWNER]) == {Role.VIEWER}
    assert acting_roles(None, ACCOUNT, ACCOUNT, [Role.OWNER]) == {Role.OWNER}  # accounts from before members
    assert acting_roles(None, MEMBER, ACCOUNT, [Role.OWNER]) == frozenset()  # never the owner's by default
    assert acting_roles(None, ACCOUNT, ACCOUNT, None) == frozenset()


def test_a_members_session_acts_with_no_roles_until_its_users_v1_state_arrives():
    served = Served()
    as_member = served.session(MEMBER)
    # Kafka was away when the owner added the viewer: it logs in (Postgres), the edge lacks its state
    assert served.http.get("/roles", headers=as_member).json() == []
    for denied in (served.http.put("/members", headers=as_member), served.http.get("/projects", headers=as_member)):
        assert (denied.status_code, denied.json()["error"]["code"]) == (403, "permission_denied")
    served.edge.users.apply(_user(MEMBER, Role.VIEWER))
    assert served.http.get("/roles", headers=as_member).json() == ["viewer"]
    assert served.http.get("/projects", headers=as_member).status_code == 200
    assert served.http.put("/members", headers=as_member).status_code == 403


def test_a_key_whose_creator_is_unknown_acts_with_no_roles_whatever_keys_v1_says():
    served = Served()
    for _ in range(2):  # the dependency's judgment, then the screen's (the route is known by then)
        denied = served.http.get("/projects", headers=_bearer(MEMBERS_KEY))
        assert (denied.status_code, denied.json()["error"]["code"]) == (403, "permission_denied")
    assert served.http.get("/roles", headers=_bearer(MEMBERS_KEY)).json() == []
    served.edge.users.apply(_user(MEMBER, Role.DEVELOPER))
    assert served.http.get("/projects", headers=_bearer(MEMBERS_KEY)).status_code == 200
    served.edge.users.apply(_user(MEMBER, Role.DEVELOPER, removed=True))
    gone = served.http.get("/projects", headers=_bearer(MEMBERS_KEY))
    assert (gone.status_code, gone.json()["error"]["code"]) == (401, "invalid_api_key")


def test_the_registering_user_and_keys_from_before_members_keep_the_accounts_roles_until_users_v1_says_otherwise():
    served = Served()
    as_owner = served.session(ACCOUNT)
    for headers in (as_owner, _bearer(OWNERS_KEY), _bearer(LEGACY_KEY)):
        assert served.http.get("/roles", headers=headers).json() == ["owner"]
    assert served.http.put("/members", headers=as_owner).status_code == 200
    # demoted (another owner stepped in): its session and both keys follow its users.v1 state
    served.edge.users.apply(_user(ACCOUNT, Role.VIEWER))
    for headers in (as_owner, _bearer(OWNERS_KEY), _bearer(LEGACY_KEY)):
        assert served.http.get("/roles", headers=headers).json() == ["viewer"]
    served.edge.users.apply(_user(ACCOUNT, Role.VIEWER, removed=True))
    for secret in (OWNERS_KEY, LEGACY_KEY):
        gone = served.http.get("/roles", headers=_bearer(secret))
        assert (gone.status_code, gone.json()["error"]["code"]) == (401, "invalid_api_key")


def test_an_edge_whose_projections_have_not_caught_up_judges_no_credential():
    served = Served(caught_up=False)
    served.edge.users.apply(_user(MEMBER, Role.OWNER))  # as far as it read: a removal may follow
    calls = [
        ("GET", "/roles", served.session(MEMBER)),
        ("GET", "/projects", _bearer(MEMBERS_KEY)),
        ("GET", "/projects", _bearer(MEMBERS_KEY)),  # the screen's turn
        ("POST", "/usage", _bearer(SERVICE_TOKEN)),
    ]
    for method, path, headers in calls:
        refused = served.http.request(method, path, headers=headers)
        assert refused.status_code == 503, (path, refused.text)
        assert refused.json()["error"]["code"] == "service_unavailable" and refused.headers["retry-after"]
        assert set(refused.json()["error"]) >= {"code", "message", "request_id"}
    served.edge.assume_caught_up()
    for method, path, headers in calls:
        assert served.http.request(method, path, headers=headers).status_code in (200, 204), path


async def test_an_edge_judges_no_credential_while_an_owner_rebuilds_its_topics():
    """(#39 item 1) An owner checking whether Kafka lost its states, and republishing them, holds
    the edge (services/runtime/platform/state_guard.py): a key it would refuse on a projection
    still empty is 503, never 401, until the check is done."""
    served = Served()
    calls = [("GET", "/projects", _bearer(OWNERS_KEY)), ("GET", "/roles", served.session(ACCOUNT))]
    async with served.edge.rebuilding():
        assert not served.edge.is_ready()
        for method, path, headers in calls:
            refused = served.http.request(method, path, headers=headers)
            assert (refused.status_code, refused.json()["error"]["code"]) == (503, "service_unavailable"), path
    assert served.edge.is_ready()
    for method, path, headers in calls:
        assert served.http.request(method, path, headers=headers).status_code == 200, path


async def test_an_edge_judges_no_credential_until_every_owner_said_its_topics_are_whole():
    """(#39 item 1) A process that runs no owner, started on topics Kafka lost: read to their
    (empty) end, it would refuse a valid key 401. It is not ready, and answers 503, until it has
    read the state-complete.v1 record of keys, billing and quota and then its topics to their end."""
    import asyncio

    from contracts.events import StateComplete
    from services.edge.state_complete import owners_of

    served = Served(caught_up=False)
    served.edge._follower.caught_up.set()  # the empty topics read to their end
    assert served.edge.completion.needed == owners_of(["keys.v1", "billing.v1", "quota.v1"]) == {"keys", "billing", "quota"}
    read_to_end: list[str] = []

    async def reach_end() -> None:
        read_to_end.append("end")

    settling = asyncio.create_task(served.edge.completion.settle(reach_end))
    unknown = "sk-" + "u" * 43  # republished soon, unknown yet: 401 would be a lie
    for owner, missing in (("keys", ["billing", "quota"]), ("billing", ["quota"])):
        record = StateComplete(time=NOW, owner=owner, held={})
        served.edge.completion.apply(owner.encode(), record.model_dump_json().encode())
        await asyncio.sleep(0)
        assert not served.edge.is_ready() and served.edge.completion.missing == missing
        refused = served.http.get("/projects", headers=_bearer(unknown))
        assert (refused.status_code, refused.json()["error"]["code"]) == (503, "service_unavailable")
    assert read_to_end == []
    served.edge.completion.apply(b"quota", StateComplete(time=NOW, owner="quota", held={}).model_dump_json().encode())
    await asyncio.wait_for(settling, 1)
    assert read_to_end == ["end"] and served.edge.is_ready()
    assert served.http.get("/projects", headers=_bearer(OWNERS_KEY)).status_code == 200
    assert served.http.get("/projects", headers=_bearer(unknown)).json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("method", "path", "token", "status", "code"),
    [
        ("GET", "/roles", b"tg1.abc.d\xe9f", 401, "invalid_session"),
        ("GET", "/roles", b"\xe9\xe9", 401, "invalid_session"),
        ("GET", "/roles", b"sk-" + b"\xe9" * 43, 401, "invalid_api_key"),
        ("POST", "/usage", b"st-" + b"\xe9" * 43, 401, "invalid_service_token"),
        ("POST", "/usage", b"tg1.abc.d\xe9f", 401, "invalid_session"),
        ("GET", "/admin", b"adm\xe9", 403, "permission_denied"),
    ],
)
def test_a_credential_with_a_byte_that_is_not_ascii_is_refused_quietly(caplog, method, path, token, status, code):
    served = Served()
    with caplog.at_level(logging.WARNING):
        refused = served.http.request(method, path, headers={"Authorization": b"Bearer " + token})
    assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []  # no traceback, no flood
