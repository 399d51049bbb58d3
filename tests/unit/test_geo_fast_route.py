"""The GEO list's fast route (services/edge/fast_routes.py, services/geo/api.py) against its documented
route: one table of callers through each, the same status, headers, body and calls.v1 event. The
product's own app (`create_app`) driven through ASGI with geo's store in memory, no I/O (the harness
of tests/unit/test_edge_verify_fast.py); the documented path is the same app with the fast route
taken out of the router's stack."""

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from contracts.common import Resource, Role, ServiceScope, UserType
from contracts.credentials import hash_secret
from contracts.events import AccountState, KeyState, QuotaState, ServiceTokenState
from contracts.keys_api import GeoProjectList
from contracts.period import period_of
from contracts.rate_limit import RateLimit
from services.edge.edge import Edge
from services.edge.fast_routes import FastRoutes
from services.geo import app as geo_app
from services.geo.store import ProjectRow
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings
from tests.unit.fakes import FakeGeoStore
from tests.unit.test_edge_verify_fast import ask, comparable

PATH = "/api/geo/projects"
OWNER, OTHER, DISABLED, LIMITED, EXHAUSTED, ELSEWHERE, UNKNOWN = ("sk-" + c * 43 for c in "odlxeru")
TOKEN = "st-" + "t" * 43
ACCOUNT, OTHER_ACCOUNT, LIMITED_ACCOUNT, EXHAUSTED_ACCOUNT = (uuid.uuid4() for _ in range(4))
NOW = datetime.now(UTC)


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Any:
    store = FakeGeoStore()
    for i, name in enumerate(["first", 'quotes " and \\ and é ü 中文', "third"]):
        row = ProjectRow(uuid.uuid4(), name, NOW + timedelta(seconds=i))
        store.projects[row.id] = (ACCOUNT, row)
    monkeypatch.setattr(geo_app, "GeoStore", lambda _pool: store)
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@127.0.0.1:1/d", session_secret="s")
    app = create_app(("geo",), settings, consumers=False)
    edge: Edge = app.state.runtime.edge
    edge.assume_caught_up()  # fed by hand
    edge.plans.default = RateLimit(per_second=1_000, burst=1_000, per_minute=100_000)
    keys = [
        (OWNER, ACCOUNT, {}),
        (OTHER, OTHER_ACCOUNT, {}),
        (DISABLED, ACCOUNT, {"status": "disabled"}),
        (LIMITED, LIMITED_ACCOUNT, {"rate_limit": RateLimit(per_second=1, burst=1, per_minute=1)}),
        (EXHAUSTED, EXHAUSTED_ACCOUNT, {}),
        (ELSEWHERE, ACCOUNT, {"allowed_routes": ["POST /api/geo/projects"]}),
    ]
    for secret, account, changes in keys:
        state = {"status": "enabled", **changes}
        edge.keys.apply(
            KeyState(time=NOW, account_id=account, key_id=uuid.uuid4(), hash=hash_secret(secret), roles=[Role.OWNER], **state)
        )
    period = period_of(NOW, edge.settings.tz)
    for account, total, used in ((ACCOUNT, 10**9, 0), (EXHAUSTED_ACCOUNT, 5, 5)):
        edge.quota.apply(
            QuotaState(
                time=NOW, account_id=account, resource=Resource.API_CALLS, period=period, total=total, used=used,
                blocked=used >= total,
            )
        )  # fmt: skip
    edge.accounts.apply(AccountState(time=NOW, account_id=ACCOUNT, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL))
    token = ServiceTokenState(
        time=NOW, token_id=uuid.uuid4(), name="svc", hash=hash_secret(TOKEN), scopes=[ServiceScope.KEYS_VERIFY]
    )
    edge.service_tokens.apply(token)
    return app


def fast_routes_of(app: Any) -> tuple[Any, FastRoutes]:
    """(the middleware in front of the fast routes, the fast routes): the router's stack holds
    verify's fast path, then these."""
    outer = app.router.middleware_stack
    while not isinstance(outer.app, FastRoutes):
        outer = outer.app
    return outer, outer.app


class Seen:
    """The router behind the fast routes: how many requests reached it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.reached = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached += 1
        await self.app(scope, receive, send)


def logged(edge: Edge) -> list[tuple[Any, ...]]:
    return [(c.account_id, c.method, c.path, c.status, c.error_code, c.ip) for c in edge.calls.lanes.take(1000)]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


# (name, method, path, headers, answered by the fast route)
CASES: list[tuple[str, str, str, dict[str, str], bool]] = [
    ("the owner's key", "GET", PATH, bearer(OWNER), True),
    ("another account's key: its own (no) projects", "GET", PATH, bearer(OTHER), True),
    ("no credentials", "GET", PATH, {}, True),
    ("not a bearer", "GET", PATH, {"authorization": "Basic b3duZXI6cHc="}, True),
    ("an unknown key", "GET", PATH, bearer(UNKNOWN), True),
    ("a disabled key", "GET", PATH, bearer(DISABLED), True),
    ("a key over its rate limit", "GET", PATH, bearer(LIMITED), True),
    ("an account whose api_calls are exhausted", "GET", PATH, bearer(EXHAUSTED), True),
    ("a key whose routes exclude the list", "GET", PATH, bearer(ELSEWHERE), True),
    ("a service token", "GET", PATH, bearer(TOKEN), True),
    ("a bad session", "GET", PATH, bearer("tg1.not.signed"), True),
    ("HEAD (not a route)", "HEAD", PATH, bearer(OWNER), False),
    ("a trailing slash", "GET", PATH + "/", bearer(OWNER), False),
    ("another method", "PUT", PATH, bearer(OWNER), False),
]


async def test_every_caller_gets_the_documented_routes_answer_and_event(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    outer, fast = fast_routes_of(app)
    router = fast.app
    await ask(app, "GET", PATH, bearer(LIMITED))  # its one call of the minute: the rest are 429s
    session = edge.issue_session(ACCOUNT, "session-1", datetime.now(UTC))
    logged(edge)
    for name, method, path, headers, answered_fast in [*CASES, ("a console session", "GET", PATH, bearer(session), True)]:
        seen = fast.app = Seen(router)
        got = await ask(app, method, path, headers)
        fast_events = logged(edge)
        assert (seen.reached == 0) is answered_fast, name
        outer.app = router
        try:
            expected = await ask(app, method, path, headers)
        finally:
            outer.app = fast
            fast.app = router
        assert comparable(*got) == comparable(*expected), name
        assert fast_events == logged(edge), name
        if got[0] == 200:
            assert got[2] == expected[2], name  # byte for byte


async def test_the_list_is_the_accounts_own_in_order_with_its_rate_limit_headers(app: Any) -> None:
    status, headers, body = await ask(app, "GET", PATH, bearer(OWNER))
    assert status == 200 and headers["content-type"] == "application/json"
    assert {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-request-id"} <= set(headers)
    items = GeoProjectList.model_validate_json(body).items
    assert [p.name for p in items] == ["first", 'quotes " and \\ and é ü 中文', "third"]
    assert json.loads((await ask(app, "GET", PATH, bearer(OTHER)))[2]) == {"items": []}


def answered(route: str) -> float:
    """How many requests the latency histogram counted under this route's label, with status 200."""
    labels = {"method": "GET", "route": route, "status": "200"}
    return REGISTRY.get_sample_value("tollgate_http_request_seconds_count", labels) or 0.0


async def test_a_fast_answer_is_labelled_by_its_route_and_teaches_the_screen_its_path(app: Any) -> None:
    before = answered(PATH)
    assert (await ask(app, "GET", PATH, bearer(OWNER)))[0] == 200
    assert answered(PATH) == before + 1
    edge: Edge = app.state.runtime.edge
    assert edge.screen(screened_scope(DISABLED)) is not None  # the route is known: the screen refuses by itself


def screened_scope(token: str) -> dict[str, Any]:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    return {"type": "http", "method": "GET", "path": PATH, "headers": headers, "client": ("127.0.0.1", 1), "state": {}}


def test_the_documented_route_still_describes_the_list() -> None:
    """The OpenAPI document: the list's 200 is the contract's GeoProjectList, its security the
    key and the session, as before the fast route."""
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@127.0.0.1:1/d", session_secret="s")
    operation = create_app(("geo",), settings, consumers=False).openapi()["paths"][PATH]["get"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/GeoProjectList"}
    assert operation["security"] == [{"ApiKey": []}, {"ConsoleSession": []}]
