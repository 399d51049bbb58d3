"""The edge's side of strict ends (docs/architecture.md, "Strict ends of sessions, users and service
tokens"): a console session the shared store says is over, and a service token it says was
revoked, are refused by an edge whose projections have not heard of it (a replica cut off from
Kafka). The shared store is a fake here; tests/integration/test_strict_ends.py runs real Redis."""

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from contracts.common import Role, ServiceScope, UserType
from contracts.credentials import hash_secret
from contracts.events import AccountState, ServiceTokenState, UserState
from services.edge import token_revocations
from services.edge.calls import CallRecorder
from services.edge.edge import Edge, _revoked_refusal
from services.edge.errors import install_error_handlers
from services.edge.key_revocations import KeyCheck, KeyRevoked
from services.edge.leases import Lease
from services.edge.middleware import RequestMiddleware
from services.edge.principal import Principal
from services.edge.rate_limit import Decision, Limits
from services.edge.rate_scripts import ScriptKeys
from services.edge.service_tokens import ServicePrincipal
from services.edge.token_revocations import CHECK_EVERY_S, TokenRevocations
from services.edge.user_revocations import CREDENTIAL_CHECK_ERRORS
from services.runtime.platform.settings import Settings
from tests.unit.fakes import FakeExistsRedis, FakeSessionEnds

NOW = datetime.now(UTC)
ACCOUNT, MEMBER = uuid.uuid4(), uuid.uuid4()
TOKEN, TOKEN_ID = "st-" + "s" * 43, uuid.uuid4()


class _Shared:
    """The parts of rate_store.RedisStore a console session and a service token ask."""

    def __init__(self) -> None:
        self.users = FakeSessionEnds()
        self.redis = FakeExistsRedis()
        self.tokens = TokenRevocations(self.redis, "t:")  # type: ignore[arg-type]  # a fake of its one command


class Served:
    def __init__(self) -> None:
        settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s")
        self.edge = edge = Edge(settings)
        edge.calls = CallRecorder(settings)
        edge.assume_caught_up()
        self.shared = _Shared()
        edge.shared = self.shared  # type: ignore[assignment]  # sessions and tokens only: no key is called here
        edge.accounts.apply(AccountState(time=NOW, account_id=ACCOUNT, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL))
        edge.users.apply(UserState(time=NOW, account_id=ACCOUNT, user_id=MEMBER, role=Role.DEVELOPER, version=4))
        edge.service_tokens.apply(
            ServiceTokenState(time=NOW, token_id=TOKEN_ID, name="gw", hash=hash_secret(TOKEN), scopes=[ServiceScope.USAGE_WRITE])
        )
        app = FastAPI()
        install_error_handlers(app)
        app.add_middleware(RequestMiddleware)

        @app.get("/roles")
        async def roles(principal: Annotated[Principal, Depends(edge.requires())]) -> list[str]:
            return sorted(principal.roles)

        @app.post("/usage")
        async def usage(service: Annotated[ServicePrincipal, Depends(edge.requires_service(ServiceScope.USAGE_WRITE))]) -> None:
            return None

        self.http = TestClient(app, raise_server_exceptions=False)

    def session(self, user_id: uuid.UUID, session_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.edge.issue_session(ACCOUNT, session_id, NOW, user_id)}"}


def _answer(response: Any) -> tuple[int, str | None]:
    return response.status_code, response.json()["error"]["code"] if response.status_code >= 400 else None


@pytest.mark.parametrize(
    ("how", "answer"),
    [
        ("logout", (401, "invalid_session")),
        ("ended", (401, "invalid_session")),  # a password change
        ("removed", (401, "invalid_session")),
        ("role", (503, "service_unavailable")),  # judged by an older role: not at all until it has the new one
    ],
)
def test_a_session_the_shared_store_says_is_over_is_refused_by_an_edge_that_has_not_heard(how, answer):
    served = Served()
    as_member = served.session(MEMBER, "sid-1")
    assert _answer(served.http.get("/roles", headers=as_member)) == (200, None)
    served.shared.users.over[(MEMBER, "sid-1")] = how
    refused = served.http.get("/roles", headers=as_member)
    assert _answer(refused) == answer
    if how == "role":
        assert refused.headers["retry-after"] == "1"
    assert _answer(served.http.get("/roles", headers=served.session(MEMBER, "sid-2"))) == (200, None)  # only that one


def test_the_session_check_asks_with_the_users_version_this_edge_judged_by_and_the_issue_time():
    served = Served()
    served.http.get("/roles", headers=served.session(MEMBER, "sid-1"))
    served.http.get("/roles", headers=served.session(ACCOUNT, "sid-2"))  # no users.v1 state of it here
    assert served.shared.users.asked == [(MEMBER, "sid-1", 4, NOW.timestamp()), (ACCOUNT, "sid-2", -1, NOW.timestamp())]


def test_a_session_is_judged_by_the_projections_alone_while_redis_fails_and_that_is_counted():
    served = Served()
    served.shared.users.failing = True
    before = CREDENTIAL_CHECK_ERRORS._value.get()
    assert _answer(served.http.get("/roles", headers=served.session(MEMBER, "sid-1"))) == (200, None)
    assert CREDENTIAL_CHECK_ERRORS._value.get() == before + 1


def test_a_service_token_revoked_in_the_shared_store_is_refused_before_its_projection_hears():
    served = Served()
    token = {"Authorization": f"Bearer {TOKEN}"}
    assert _answer(served.http.post("/usage", headers=token)) == (200, None)
    served.shared.redis.names.add(f"t:{TOKEN_ID}")  # another replica's revocation
    served.shared.tokens._live_until.clear()  # (its last answer has aged past CHECK_EVERY_S)
    assert _answer(served.http.post("/usage", headers=token)) == (401, "invalid_service_token")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


async def test_a_tokens_answer_holds_for_check_every_s_and_calls_meanwhile_share_one_question(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(token_revocations, "time", clock)
    redis = FakeExistsRedis()
    tokens = TokenRevocations(redis, "t:")  # type: ignore[arg-type]
    assert await asyncio.gather(*(tokens.revoked(TOKEN_ID) for _ in range(5))) == [False] * 5
    assert redis.asked == 1  # five calls at once: one question
    clock.now += CHECK_EVERY_S / 2
    assert await tokens.revoked(TOKEN_ID) is False and redis.asked == 1
    await tokens.revoke(TOKEN_ID, 3)
    clock.now += CHECK_EVERY_S / 2  # the answer's time is over: asked again, found revoked
    assert await tokens.revoked(TOKEN_ID) is True and redis.asked == 2
    clock.now += 10
    assert await tokens.revoked(TOKEN_ID) is True and redis.asked == 2  # final: never asked again


async def test_a_token_is_judged_by_the_projection_alone_while_redis_fails_and_asked_again_next_time():
    redis = FakeExistsRedis()
    tokens = TokenRevocations(redis, "t:")  # type: ignore[arg-type]
    redis.failing = True
    before = CREDENTIAL_CHECK_ERRORS._value.get()
    assert await tokens.revoked(TOKEN_ID) is False
    assert CREDENTIAL_CHECK_ERRORS._value.get() == before + 1
    redis.failing = False
    redis.names.add(f"t:{TOKEN_ID}")
    assert await tokens.revoked(TOKEN_ID) is True  # the failure was not remembered as an answer


def test_a_key_whose_user_was_removed_or_reroled_answers_as_its_state_will():
    removed, reroled = _revoked_refusal(KeyRevoked("removed")), _revoked_refusal(KeyRevoked("role"))
    assert (removed.status, removed.code.value) == (401, "invalid_api_key")
    assert (reroled.status, reroled.code.value, reroled.headers["Retry-After"]) == (503, "service_unavailable", "1")
    assert "role" in reroled.message


def test_the_scripts_ask_the_user_entry_only_for_a_key_check_with_a_user():
    keys = ScriptKeys("rl:", "adm:", "rev:", "user:")
    per = [Limits(1.0, 1, 60), Limits(1.0, 1, 60)]
    key_id = uuid.uuid4()
    with_user, args = keys.call(("a", "k"), per, 1.0, None, KeyCheck(key_id, 3, MEMBER, 4), take=True)
    assert with_user == ["rl:a", "rl:k", f"rev:{key_id}", f"user:{MEMBER}"] and args[-1] == 4
    assert keys.entries(KeyCheck(key_id, 3, MEMBER, 4)) == 2
    alone, args = keys.call(("a", "k"), per, 1.0, None, KeyCheck(key_id, 3), take=True)
    assert alone == ["rl:a", "rl:k", f"rev:{key_id}"] and args[-1] == -2 and keys.entries(KeyCheck(key_id, 3)) == 1
    _, args = keys.call(("a", "k"), per, 1.0, None, None, take=True)
    assert args[-1] == -2 and keys.entries(None) == 0


def test_a_lease_serves_only_calls_judged_by_the_users_state_it_was_taken_with():
    lease = Lease("0:l", 0, 7, (100,), 3, 10.0, Decision(True, 50, 40, 12, 0), 60.0, user_version=4)
    assert lease.take(7, (100,), 1.0, 5) is None  # the user's role changed since: Redis judges it
    assert lease.take(7, (100,), 1.0, 4) is not None and lease.left == 2
