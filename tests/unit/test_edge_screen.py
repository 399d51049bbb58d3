"""The screen (services/edge/screen.py): an API-key call's 401 and 429 answered before routing,
exactly as the route's dependency answers them. The product's own app (`create_app`: its
middleware, error handlers and routing) driven straight through ASGI, no I/O."""

import asyncio
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.types import Message

from contracts.common import Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.rate_limit import RateLimit
from services.edge.edge import Edge
from services.edge.rate_limit import Decision, Limits
from services.edge.rate_store import MemoryStore
from services.edge.screen import REFUSAL_YIELD_S
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings

PATH = "/api/geo/projects"
ROUTE = "/api/geo/projects"
ENABLED, DISABLED, EXPIRED, DELETED = ("sk-" + c * 43 for c in "edxz")
UNKNOWN = "sk-" + "u" * 43


JSON_POST: dict[str, Any] = {"method": "POST", "extra": [(b"content-type", b"application/json")]}


async def others_run() -> None:
    """Let the loop's other tasks run until they wait on something or are done."""
    for _ in range(20):
        await asyncio.sleep(0)


class Answer:
    def __init__(self, scope: dict[str, Any], messages: list[Message]) -> None:
        start = next(m for m in messages if m["type"] == "http.response.start")
        self.scope = scope
        self.status: int = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.body = json.loads(b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body"))

    @property
    def routed(self) -> bool:
        """The router ran (it sets the path parameters); the screen answers before it does."""
        return "path_params" in self.scope

    def comparable(self) -> tuple[int, dict[str, str], dict[str, Any]]:
        """Status, headers and body without what differs per request: its id, and the seconds
        to the limiter's next minute or token (one second apart across a boundary)."""
        headers = {k: v for k, v in self.headers.items() if k not in ("x-request-id", "x-ratelimit-reset", "retry-after")}
        body = json.loads(json.dumps(self.body))
        body["error"].pop("request_id")
        return self.status, headers, body


async def call(
    app: Any,
    token: str | None,
    *,
    method: str = "GET",
    path: str = PATH,
    extra: list[tuple[bytes, bytes]] | None = None,
    body_sent: asyncio.Event | None = None,
) -> Answer:
    headers = [(b"host", b"tollgate"), (b"user-agent", b"test/1"), *(extra or [])]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip
    messages: list[Message] = []

    async def receive() -> Message:
        if body_sent is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        await body_sent.wait()  # a client still sending its body: the call is being served meanwhile
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        messages.append(message)

    await app(scope, receive, send)
    return Answer(scope, messages)


@pytest.fixture
def app() -> Any:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@127.0.0.1:1/d", session_secret="s")
    app = create_app(("geo",), settings, consumers=False)
    edge: Edge = app.state.runtime.edge
    edge.assume_caught_up()  # fed by hand below
    account = uuid.uuid4()
    now = datetime.now(UTC)
    for secret in (ENABLED, DISABLED, EXPIRED, DELETED):
        edge.keys.apply(
            KeyState(
                time=now,
                account_id=account,
                key_id=uuid.uuid4(),
                hash=hash_secret(secret),
                status="disabled" if secret == DISABLED else "enabled",
                expires_at=now - timedelta(seconds=1) if secret == EXPIRED else None,
                roles=[Role.OWNER],
            )
        )
    edge.keys.remove(edge.keys.get(hash_secret(DELETED)).key_id)  # type: ignore[union-attr]  # its tombstone
    return app


def logged_calls(app: Any) -> list[tuple[str, str, int, str | None, str]]:
    edge: Edge = app.state.runtime.edge
    return [(c.method, c.path, c.status, c.error_code, c.user_agent) for c in edge.calls.lanes.take(1000)]


@pytest.mark.parametrize(
    ("token", "status", "code"),
    [
        (UNKNOWN, 401, "invalid_api_key"),
        (DISABLED, 401, "api_key_disabled"),
        (EXPIRED, 401, "api_key_expired"),
        (DELETED, 401, "invalid_api_key"),
    ],
)
async def test_a_key_refused_before_routing_gets_the_routes_own_answer_and_its_call_is_logged_alike(
    app: Any, token: str, status: int, code: str
) -> None:
    routed = await call(app, token)  # the path's first call: the route's dependency answers (and the screen learns the path)
    screened = await call(app, token)
    assert routed.routed and not screened.routed
    assert screened.comparable() == routed.comparable()
    assert (screened.status, screened.body["error"]["code"]) == (status, code)
    assert screened.headers["www-authenticate"] == "Bearer" and screened.headers["x-request-id"]
    assert screened.body["error"]["request_id"] == screened.headers["x-request-id"]
    # A known key's refusal is a call of its account, logged the same way; an unknown key's is nobody's.
    calls = logged_calls(app)
    assert calls == ([] if token == UNKNOWN else [("GET", ROUTE, status, code, "test/1")] * 2)


async def test_a_key_over_its_rate_limit_is_refused_before_routing_with_the_same_429_and_headers(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    edge.plans.default = RateLimit(per_second=0.001, burst=1, per_minute=1)
    admitted = await call(app, ENABLED)  # takes the only token (its handler: 503 without Postgres)
    assert admitted.routed and admitted.status == 503
    # A path the screen has not seen yet: the route's dependency refuses it ...
    routed = await call(app, ENABLED, method="DELETE", path=f"{PATH}/{uuid.uuid4()}")
    # ... and the path it has seen: the screen, from the limiter's slots.
    screened = await call(app, ENABLED)
    assert routed.routed and not screened.routed
    assert screened.comparable() == routed.comparable()
    assert screened.status == 429 and screened.body["error"]["code"] == "rate_limited"
    assert int(screened.headers["retry-after"]) >= 1 and int(screened.headers["x-ratelimit-reset"]) >= 0
    assert [c for c in logged_calls(app) if c[3] is not None] == [
        ("DELETE", f"{ROUTE}/{{project_id}}", 429, "rate_limited", "test/1"),
        ("GET", ROUTE, 429, "rate_limited", "test/1"),
    ]


async def test_an_admitted_key_passes_the_screen_once_and_a_toggle_refuses_it_at_once(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    first, second = await call(app, ENABLED), await call(app, ENABLED)
    assert first.routed and second.routed  # the screen let it through to its route
    assert second.status == 503  # its handler's: no Postgres here
    state = edge.keys.get(hash_secret(ENABLED))
    assert state is not None
    edge.keys.apply(state.model_copy(update={"status": "disabled", "time": datetime.now(UTC)}))
    toggled = await call(app, ENABLED)
    assert not toggled.routed and (toggled.status, toggled.body["error"]["code"]) == (401, "api_key_disabled")


async def test_other_credentials_and_unseen_paths_are_left_to_the_route(app: Any) -> None:
    await call(app, UNKNOWN)  # the path is now screened for API keys
    for token, code in ((None, "missing_credentials"), ("tg1.forged.session", "invalid_session")):
        answer = await call(app, token)
        assert answer.routed and (answer.status, answer.body["error"]["code"]) == (401, code)
    service = await call(app, "st-" + "s" * 43)
    assert service.routed and service.status == 401
    other = await call(app, UNKNOWN, method="DELETE", path=f"{PATH}/{uuid.uuid4()}")  # a path no call has reached
    assert other.routed and other.status == 401


async def test_a_body_over_the_limit_is_still_413_before_the_screen(app: Any) -> None:
    await call(app, UNKNOWN)
    answer = await call(app, UNKNOWN, extra=[(b"content-length", str(10**9).encode())])
    assert (answer.status, answer.body["error"]["code"]) == (413, "payload_too_large")


class JudgedElsewhere:
    """A limiter (the in-process one inside) whose judgment of the key is in flight until
    `pending` is done: a refusal copy that let a call through, waiting for Redis's answer."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.pending: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def hit(self, subjects: Sequence[str], limits: Limits, now: float) -> Decision:
        return await self.inner.hit(subjects, limits, now)

    def refused(self, subjects: Sequence[str], limits: Limits, now: float) -> Decision | None:
        return self.inner.refused(subjects, limits, now) if self.pending.done() else None

    def judging(self, subjects: Sequence[str]) -> asyncio.Future[None] | None:
        return None if self.pending.done() else self.pending

    async def close(self) -> None:
        return None


async def test_a_call_arriving_while_its_key_is_judged_waits_for_that_judgment_and_is_screened_again(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    edge.plans.default = RateLimit(per_second=0.001, burst=1, per_minute=1)
    assert (await call(app, ENABLED)).routed  # the path is screened from now on; the only token is taken
    assert isinstance(edge.limiter, MemoryStore)
    limiter = edge.limiter = JudgedElsewhere(edge.limiter)
    waiting = asyncio.create_task(call(app, ENABLED))
    await others_run()
    assert not waiting.done()  # neither answered nor sent down its route while the judgment is out
    limiter.pending.set_result(None)  # the judgment came back: the key is over its limit
    answer = await waiting
    assert not answer.routed and answer.status == 429 and answer.body["error"]["code"] == "rate_limited"


async def test_a_refusal_yields_while_other_tenants_calls_are_served_and_is_answered_at_once_when_none_are(
    app: Any,
) -> None:
    loop = asyncio.get_running_loop()
    await call(app, UNKNOWN)  # the path is screened from now on
    body_sent = asyncio.Event()
    served = asyncio.create_task(call(app, ENABLED, **JSON_POST, body_sent=body_sent))
    await others_run()
    assert not served.done()  # past the screen, waiting for its body
    started = loop.time()
    refused = await call(app, UNKNOWN)
    assert not refused.routed and refused.status == 401
    assert loop.time() - started >= REFUSAL_YIELD_S * 0.99  # answered, after yielding to the call being served
    body_sent.set()
    assert (await served).routed
    alone = asyncio.create_task(call(app, UNKNOWN))
    await others_run()
    assert alone.done() and alone.result().status == 401  # nothing served: no timer, no wait


async def test_a_refusal_does_not_yield_to_its_own_accounts_served_calls(app: Any) -> None:
    """A flood beside its own admitted calls (one per refill) is not held back by them."""
    await call(app, DISABLED)
    await call(app, ENABLED, **JSON_POST)  # both paths are screened from now on: the screen knows the POST's account
    body_sent = asyncio.Event()
    served = asyncio.create_task(call(app, ENABLED, **JSON_POST, body_sent=body_sent))
    await others_run()
    assert not served.done()  # past the screen, waiting for its body
    own = asyncio.create_task(call(app, DISABLED))  # the same account's key, refused
    others = asyncio.create_task(call(app, UNKNOWN))  # nobody's: yields to every served call
    await others_run()
    assert own.done() and (own.result().status, own.result().body["error"]["code"]) == (401, "api_key_disabled")
    assert not others.done()
    body_sent.set()
    assert (await served).routed and (await others).status == 401
