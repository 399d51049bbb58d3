"""verify's and authorize's fast path (services/edge/verify_fast.py) against the documented routes
(services/edge/verify_api.py): one table of requests through each, the same answers and the same
calls.v1 events. The product's own app (`create_app`) driven through ASGI, no I/O (the harness of
tests/unit/test_edge_screen.py); the documented path is the same app with the fast path taken out
of the router's stack. And the body's reading: whatever the fast path accepts, the route accepts
as the same call (a hypothesis run over JSON near and far from the contract's)."""

import json
import re
import string
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from starlette.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from contracts.common import Role, ServiceScope
from contracts.credentials import hash_secret
from contracts.edge_api import VerifyRequest
from contracts.events import KeyState, ServiceTokenState
from services.edge.edge import Edge
from services.edge.errors import install_error_handlers
from services.edge.verify_fast import VerifyFastPath, parse_verify_body
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings
from tests.unit.test_edge_screen import DISABLED, ENABLED, UNKNOWN

VERIFIER, WRITER, REVOKED = ("st-" + c * 43 for c in "vwr")
ADMIN = "admin-" + "a" * 40
VERIFY = "/api/edge/verify"
AUTHORIZE = "/api/edge/authorize"
BODY: dict[str, Any] = {"key": ENABLED, "method": "GET", "path": "/v1/models", "ip": "203.0.113.7", "user_agent": "t/1"}


@pytest.fixture
def app() -> Any:
    settings = Settings(
        kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@127.0.0.1:1/d", session_secret="s", admin_token=ADMIN
    )
    app = create_app(("geo",), settings, consumers=False)
    edge: Edge = app.state.runtime.edge
    edge.assume_caught_up()  # fed by hand
    account, now = uuid.uuid4(), datetime.now(UTC)
    for secret in (ENABLED, DISABLED):
        status = "disabled" if secret == DISABLED else "enabled"
        state = KeyState(
            time=now, account_id=account, key_id=uuid.uuid4(), hash=hash_secret(secret), status=status, roles=[Role.OWNER]
        )
        edge.keys.apply(state)
    tokens(edge)
    return app


def tokens(edge: Edge) -> None:
    now = datetime.now(UTC)
    for secret, scopes in ((VERIFIER, [ServiceScope.KEYS_VERIFY]), (WRITER, [ServiceScope.USAGE_WRITE])):
        state = ServiceTokenState(
            time=now, token_id=uuid.uuid4(), name=f"svc-{secret[3]}", hash=hash_secret(secret), scopes=scopes
        )
        edge.service_tokens.apply(state)


class Seen:
    """The router behind the fast path: which requests reached it, and the body they read there."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        read: list[bytes] = []

        async def recorded() -> Message:
            message = await receive()
            read.append(message.get("body", b""))
            return message

        try:
            await self.app(scope, recorded, send)
        finally:
            self.bodies.append(b"".join(read))


async def ask(
    app: Any, method: str, path: str, headers: dict[str, str], body: bytes = b"", chunks: int = 1
) -> tuple[int, dict[str, str], bytes]:
    raw = [(b"host", b"tollgate"), *((k.lower().encode(), v.encode()) for k, v in headers.items())]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": raw,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    incoming: list[Message] = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, b"".join(m.get("body", b"") for m in sent[1:])


def comparable(status: int, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], Any]:
    """Without what differs per request: its id (in the body and nginx's header copy), and the
    rate limit's room, which each admitted call spends."""
    kept = {k: v for k, v in headers.items() if k not in ("x-request-id", "x-ratelimit-remaining", "x-ratelimit-reset")}
    for name in ("x-tollgate-error",):
        if name in kept:
            copy = json.loads(kept[name])
            copy["error"].pop("request_id")
            kept[name] = json.dumps(copy)
    document = json.loads(body) if body else None
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict):
            (error.get("error") or error).pop("request_id", None)
        if isinstance(document.get("rate_limit"), dict):
            document["rate_limit"].pop("remaining")
            document["rate_limit"].pop("reset")
    return status, kept, document


def shape(body: bytes) -> bytes:
    """The bytes of an answer with its request id and numbers blanked: the same keys, order and spacing."""
    return re.sub(rb"\d+", b"0", re.sub(rb'"request_id":"[^"]*"', b'"request_id":""', body))


def verify_json(body: Any, token: str | None = VERIFIER, content_type: str = "application/json") -> tuple[dict[str, str], bytes]:
    headers = {"content-type": content_type} if content_type else {}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return headers, body if isinstance(body, bytes) else json.dumps(body).encode()


# (name, headers, body, answered by the fast path)
VERIFY_CASES: list[tuple[str, tuple[dict[str, str], bytes], bool]] = [
    ("valid", verify_json(BODY), True),
    ("valid, a flow's cost gated", verify_json({**BODY, "resource": "ai_tokens", "cost": 10**12}), True),
    ("valid, cost as a string (lax, as the route)", verify_json({**BODY, "cost": "5"}), True),
    ("unknown key", verify_json({**BODY, "key": UNKNOWN}), True),
    ("disabled key", verify_json({**BODY, "key": DISABLED}), True),
    ("no key", verify_json({**BODY, "key": ""}), True),
    ("a service token as the key", verify_json({**BODY, "key": VERIFIER}), True),
    ("a permission the owner holds", verify_json({**BODY, "permission": "projects:write"}), True),
    ("no credentials", verify_json(BODY, None), False),
    ("an unknown service token", verify_json(BODY, REVOKED), False),
    ("a token without keys:verify", verify_json(BODY, WRITER), False),
    ("a customer's key", verify_json(BODY, ENABLED), False),
    ("the operator's token", verify_json(BODY, ADMIN), False),
    ("a session-like token", verify_json(BODY, "tg1.x.y"), False),
    ("a customer's key and a bad body", verify_json({**BODY, "cost": -1}, ENABLED), False),
    ("path too long", verify_json({**BODY, "path": "/" + "a" * 600}), False),
    ("path without a slash", verify_json({**BODY, "path": "no-slash"}), False),
    ("path with a space", verify_json({**BODY, "path": "/with space"}), False),
    ("method with a path", verify_json({**BODY, "method": "GET /x"}), False),
    ("method in lower case", verify_json({**BODY, "method": "get"}), False),
    ("not an address", verify_json({**BODY, "ip": "not-an-ip"}), False),
    ("cost over 10^12", verify_json({**BODY, "cost": 10**12 + 1}), False),
    ("negative cost", verify_json({**BODY, "cost": -1}), False),
    ("unknown permission", verify_json({**BODY, "permission": "root:all"}), False),
    ("unknown resource", verify_json({**BODY, "resource": "gold"}), False),
    ("model without a provider", verify_json({**BODY, "model": "gpt"}), False),
    ("no key field", verify_json({k: v for k, v in BODY.items() if k != "key"}), False),
    ("an extra field", verify_json({**BODY, "surprise": 1}), False),
    ("a list", verify_json([BODY]), False),
    ("a string", verify_json("key"), False),
    ("broken JSON", verify_json(b"{"), False),
    ("empty body", verify_json(b""), False),
    ("not UTF-8", verify_json(b'{"key": "\xff"}'), False),
    ("nested past the recursion limit", verify_json(b"[" * 100_000), False),
    ("NaN for a cost", verify_json(b'{"key":"x","method":"GET","path":"/","ip":"::1","cost":NaN}'), False),
    ("text/plain", verify_json(BODY, content_type="text/plain"), False),
    ("no content type", verify_json(BODY, content_type=""), False),
    ("JSON with a charset (the route reads it)", verify_json(BODY, content_type="application/json; charset=utf-8"), False),
]


def documented(app: Any) -> Any:
    """The same app without its fast path: every request down the routes."""
    stack = app.router.middleware_stack
    assert isinstance(stack, VerifyFastPath)
    return stack.app


def logged(edge: Edge) -> list[tuple[Any, ...]]:
    return [(c.method, c.path, c.status, c.error_code, c.service, c.ip, c.user_agent) for c in edge.calls.lanes.take(1000)]


@pytest.mark.parametrize(("chunks"), [1, 3])
async def test_verify_answers_and_events_are_the_documented_routes_for_every_request(app: Any, chunks: int) -> None:
    edge: Edge = app.state.runtime.edge
    router = documented(app)
    fast: VerifyFastPath = app.router.middleware_stack
    for name, (headers, body), answered_fast in VERIFY_CASES:
        seen = fast.app = Seen(router)
        got = await ask(app, "POST", VERIFY, headers, body, chunks)
        fast_events = logged(edge)
        assert (seen.bodies == []) is answered_fast, name
        if not answered_fast:
            assert seen.bodies == [body], name  # the route read the body the client sent, replayed
        app.router.middleware_stack = router
        try:
            expected = await ask(app, "POST", VERIFY, headers, body, chunks)
        finally:
            app.router.middleware_stack = fast
        assert comparable(*got) == comparable(*expected), name
        assert fast_events == logged(edge), name
        assert shape(got[2]) == shape(expected[2]), name  # byte for byte, but for the ids and the numbers
    fast.app = router


AUTHORIZE_OK = {
    "x-tollgate-service-token": VERIFIER, "authorization": f"Bearer {ENABLED}",
    "x-forwarded-method": "POST", "x-forwarded-uri": "/v1/chat?stream=1", "user-agent": "caller/1",
}  # fmt: skip
AUTHORIZE_CASES: list[tuple[str, dict[str, str], bool]] = [
    ("admitted", AUTHORIZE_OK, True),
    (
        "nginx's X-Original-*",
        {
            **{k: v for k, v in AUTHORIZE_OK.items() if "forwarded" not in k},
            "x-original-method": "GET",
            "x-original-uri": "/v1/models",
        },
        True,
    ),
    ("a flow's cost past the quota", {**AUTHORIZE_OK, "x-tollgate-resource": "ai_tokens", "x-tollgate-cost": str(10**12)}, True),
    ("a disabled key", {**AUTHORIZE_OK, "authorization": f"Bearer {DISABLED}"}, True),
    ("no key", {k: v for k, v in AUTHORIZE_OK.items() if k != "authorization"}, True),
    ("a forwarded address", {**AUTHORIZE_OK, "x-forwarded-for": "198.51.100.1"}, True),
    ("no ingress token", {k: v for k, v in AUTHORIZE_OK.items() if k != "x-tollgate-service-token"}, False),
    ("an unknown ingress token", {**AUTHORIZE_OK, "x-tollgate-service-token": REVOKED}, False),
    ("an ingress token without keys:verify", {**AUTHORIZE_OK, "x-tollgate-service-token": WRITER}, False),
    ("an absurd URI", {**AUTHORIZE_OK, "x-forwarded-uri": "x" * 10}, False),
    ("no forwarded method", {k: v for k, v in AUTHORIZE_OK.items() if k != "x-forwarded-method"}, False),
    ("a cost that is no number", {**AUTHORIZE_OK, "x-tollgate-cost": "lots"}, False),
    ("a cost over 10^12", {**AUTHORIZE_OK, "x-tollgate-cost": str(10**12 + 1)}, False),
]


async def test_authorize_answers_and_events_are_the_documented_routes_for_every_request(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    router = documented(app)
    fast: VerifyFastPath = app.router.middleware_stack
    for name, headers, answered_fast in AUTHORIZE_CASES:
        seen = fast.app = Seen(router)
        got = await ask(app, "GET", AUTHORIZE, headers)
        fast_events = logged(edge)
        assert (seen.bodies == []) is answered_fast, name
        app.router.middleware_stack = router
        try:
            expected = await ask(app, "GET", AUTHORIZE, headers)
        finally:
            app.router.middleware_stack = fast
        assert comparable(*got) == comparable(*expected), name
        assert fast_events == logged(edge), name
    fast.app = router


async def test_other_requests_pass_by_untouched(app: Any) -> None:
    """Envoy's shape (/authorize/{path}), other methods and paths: the routes, as before."""
    fast: VerifyFastPath = app.router.middleware_stack
    seen = fast.app = Seen(fast.app)
    envoy = await ask(app, "POST", AUTHORIZE + "/v1/chat", {k: v for k, v in AUTHORIZE_OK.items() if "forwarded" not in k})
    assert envoy[0] == 200 and envoy[1]["x-tollgate-key"]
    assert (await ask(app, "GET", VERIFY, {"authorization": f"Bearer {VERIFIER}"}))[0] == 405
    assert (await ask(app, "GET", "/healthz", {}))[0] == 200
    assert len(seen.bodies) == 3


def answered(method: str, route: str) -> float:
    """How many requests the latency histogram counted under this route's label, with status 200."""
    return (
        REGISTRY.get_sample_value("tollgate_http_request_seconds_count", {"method": method, "route": route, "status": "200"})
        or 0.0
    )


async def test_the_metrics_label_the_fast_answers_by_their_route(app: Any) -> None:
    before = answered("POST", VERIFY), answered("GET", AUTHORIZE)
    headers, body = verify_json(BODY)
    assert (await ask(app, "POST", VERIFY, headers, body))[0] == 200
    assert (await ask(app, "GET", AUTHORIZE, AUTHORIZE_OK))[0] == 200
    assert (answered("POST", VERIFY), answered("GET", AUTHORIZE)) == (before[0] + 1, before[1] + 1)


# ---- the body's reading, against FastAPI's own -------------------------------------------------------
def _route_app() -> TestClient:
    """A bare route with verify's body parameter: what FastAPI accepts, and as what. With the
    product's error handlers: FastAPI's own 422 echoes the input, and cannot encode an infinity
    (Python's json reads `Infinity`), which made this test fail now and then."""
    bare = FastAPI()
    install_error_handlers(bare)

    @bare.post("/v")
    async def v(body: VerifyRequest) -> dict[str, Any]:
        return body.model_dump(mode="json")

    return TestClient(bare)


ROUTE = _route_app()
printable = st.text(alphabet=string.printable, max_size=20)
near = st.fixed_dictionaries(
    {
        "key": st.one_of(st.just(ENABLED), printable, st.integers()),
        "method": st.one_of(st.sampled_from(["GET", "POST", "get", "G ET", "A" * 17]), printable),
        "path": st.one_of(st.sampled_from(["/", "/v1/x", "/" + "a" * 511, "/" + "a" * 512, "x", "/a b"]), printable),
        "ip": st.sampled_from(["203.0.113.7", "::1", "::ffff:1.2.3.4", "999.1.1.1", "", "1.2.3"]),
    },
    optional={
        "user_agent": st.one_of(printable, st.none(), st.just("u" * 513)),
        "resource": st.one_of(st.sampled_from(["ai_tokens", "api_calls", "gold", ""]), st.none(), st.integers()),
        "cost": st.one_of(st.integers(min_value=-2, max_value=10**12 + 2), st.sampled_from(["5", "5.0", 5.0, 5.5, True, None])),
        "permission": st.one_of(st.sampled_from(["projects:write", "keys:read", "root"]), st.none()),
        "model": st.one_of(st.sampled_from(["openai/gpt-4o", "gpt", "a/b c", "/x"]), st.none()),
        "extra": st.integers(),
    },
)
far = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), printable),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(printable, inner, max_size=3)),
    max_leaves=8,
)


@given(document=st.one_of(near, far))
@example(document=float("inf"))
@example(document={"key": "sk-x", "method": "GET", "path": "/", "cost": float("nan")})
def test_the_fast_path_reads_a_body_exactly_as_the_route_does(document: Any) -> None:
    body = json.dumps(document).encode()
    parsed = parse_verify_body(body, "application/json")
    answer = ROUTE.post("/v", content=body, headers={"content-type": "application/json"})
    assert answer.status_code in (200, 422)
    if parsed is None:
        assert answer.status_code == 422, document
    else:
        assert answer.status_code == 200 and answer.json() == parsed.model_dump(mode="json"), document


@given(body=st.binary(max_size=60))
def test_bytes_that_are_not_json_are_the_routes_to_answer(body: bytes) -> None:
    parsed = parse_verify_body(body, "application/json")
    if parsed is not None:  # (rarely) valid JSON of the contract: the route takes it alike
        assert ROUTE.post("/v", content=body, headers={"content-type": "application/json"}).status_code == 200


def test_other_content_types_are_left_to_the_route():
    body = json.dumps(BODY).encode()
    assert parse_verify_body(body, "application/json") is not None
    assert parse_verify_body(body, "APPLICATION/JSON") is not None
    for other in (None, "text/plain", "application/json; charset=utf-8", "application/problem+json"):
        assert parse_verify_body(body, other) is None
