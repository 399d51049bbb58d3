"""The one request middleware and the CallContext it finishes, driven straight through ASGI (no
server, no Kafka: the recorder is not started, so the calls stay in its lanes)."""

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from prometheus_client import REGISTRY

from contracts.common import Permission, Role
from contracts.credentials import hash_secret
from contracts.domain_errors import Forbidden
from contracts.errors import ErrorCode
from contracts.events import KeyState
from contracts.rate_limit import RateLimit
from services.edge.body_limit import BodyLimitMiddleware
from services.edge.calls import Call, CallRecorder
from services.edge.context import CALL_CONTEXT, CallContext, context_of
from services.edge.edge import Edge
from services.edge.errors import ApiError, install_error_handlers
from services.edge.middleware import RequestMiddleware, request_id_from
from services.edge.principal import Principal
from services.runtime.platform.settings import Settings

T = datetime(2026, 11, 23, 9, 0, 0, tzinfo=UTC)
SECRET, DISABLED = "sk-" + "a" * 40, "sk-" + "b" * 40


def _settings() -> Settings:
    return Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s")


class Response:
    def __init__(self, status: int, headers: dict[str, str], context: CallContext) -> None:
        self.status, self.headers, self.context = status, headers, context


class Served:
    """An app with the edge as create_app mounts it (error handlers, body limit, the middleware)."""

    def __init__(self, max_buffer: int = 10_000) -> None:
        self.edge = Edge(_settings())
        self.edge.assume_caught_up()
        self.edge.calls = CallRecorder(self.edge.settings, max_buffer=max_buffer)  # not started
        self.account = uuid.uuid4()
        self.keys = {SECRET: uuid.uuid4(), DISABLED: uuid.uuid4()}
        for secret, key in self.keys.items():
            status = "disabled" if secret == DISABLED else "enabled"
            self.edge.keys.apply(
                KeyState(
                    time=T,
                    account_id=self.account,
                    key_id=key,
                    hash=hash_secret(secret),
                    status=status,
                    roles=[Role.VIEWER],
                )
            )
        app = FastAPI()
        install_error_handlers(app)
        app.add_middleware(BodyLimitMiddleware, max_bytes=10)
        app.add_middleware(RequestMiddleware)
        self.app = app
        edge = self.edge

        @app.get("/read")
        async def read(principal: Annotated[Principal, Depends(edge.requires(Permission.PROJECTS_READ))]) -> dict[str, str]:
            return {"ok": "yes"}

        @app.get("/write")
        async def write(principal: Annotated[Principal, Depends(edge.requires(Permission.PROJECTS_WRITE))]) -> None:
            return None

        @app.get("/domain-refuses")
        async def domain_refuses(principal: Annotated[Principal, Depends(edge.requires())]) -> None:
            raise Forbidden("Not this one.")

        @app.get("/not-found")
        async def not_found(principal: Annotated[Principal, Depends(edge.requires())]) -> None:
            raise ApiError(404, ErrorCode.NOT_FOUND, "No such thing.")

        @app.get("/boom")
        async def boom() -> None:
            raise RuntimeError("unexpected")

        @app.post("/echo")
        async def echo(body: dict[str, Any]) -> dict[str, Any]:
            return body

    async def get(self, path: str, headers: dict[str, str] | None = None, *, method: str = "GET", body: bytes = b"") -> Response:
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in (headers or {}).items()]
            + [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        try:
            await self.app(scope, receive, send)
        except RuntimeError:
            pass  # Starlette re-raises an unhandled error after answering it
        start = next(m for m in sent if m["type"] == "http.response.start")
        return Response(start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, scope[CALL_CONTEXT])

    def calls(self) -> list[Call]:
        return self.edge.calls.lanes.take(100)


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _observed(route: str, status: int, method: str = "GET") -> float:
    labels = {"method": method, "route": route, "status": str(status)}
    return REGISTRY.get_sample_value("tollgate_http_request_seconds_count", labels) or 0.0


# ---- the call's event ------------------------------------------------------------------------
async def test_an_admitted_call_is_recorded_on_its_place_with_no_error_code():
    served = Served()
    r = await served.get("/read", _bearer(SECRET) | {"User-Agent": "ua/1"})
    assert r.status == 200
    assert r.context.principal is not None and r.context.principal.api_key_id == served.keys[SECRET]
    (call,) = served.calls()
    assert (call.status, call.error_code, call.admitted) == (200, None, True)
    assert (call.api_key_id, call.path, call.user_agent) == (served.keys[SECRET], "/read", "ua/1")
    assert call.latency_ms > 0
    assert served.edge.calls.lanes.open == 1  # its place stays held until Kafka acknowledges it


@pytest.mark.parametrize(
    ("path", "secret", "status", "code", "admitted"),
    [
        ("/read", DISABLED, 401, "api_key_disabled", False),  # refused by the edge before admission
        ("/write", SECRET, 403, "permission_denied", False),  # a viewer's key
        ("/domain-refuses", SECRET, 403, "permission_denied", True),  # a DomainError of the handler
    ],
)
async def test_a_refused_call_carries_the_code_it_was_answered_with(path, secret, status, code, admitted):
    served = Served()
    r = await served.get(path, _bearer(secret))
    assert r.status == status and r.context.error_code == code
    (call,) = served.calls()
    assert (call.status, call.error_code, call.admitted) == (status, code, admitted)
    assert call.api_key_id == served.keys[secret]


async def test_an_error_that_is_not_a_refusal_gives_an_admitted_call_no_error_code():
    served = Served()
    r = await served.get("/not-found", _bearer(SECRET))
    assert r.status == 404 and r.context.error_code == "not_found"
    (call,) = served.calls()
    assert (call.status, call.error_code, call.admitted) == (404, None, True)


async def test_a_503_overloaded_records_no_event_and_holds_no_place():
    served = Served(max_buffer=1)
    assert (await served.get("/read", _bearer(SECRET))).status == 200
    r = await served.get("/read", _bearer(SECRET))
    assert r.status == 503 and r.context.error_code == "overloaded" and r.headers["retry-after"] == "1"
    assert [c.status for c in served.calls()] == [200]
    assert served.edge.calls.lanes.open == 1


async def test_a_call_without_credentials_records_nothing():
    served = Served()
    r = await served.get("/read")
    assert r.status == 401 and r.context.error_code == "missing_credentials" and r.context.call is None
    assert served.calls() == []


# ---- response headers and request id ---------------------------------------------------------
async def test_the_rate_limit_headers_are_on_successes_and_errors_alike():
    served = Served()
    ok = await served.get("/read", _bearer(SECRET))
    denied = await served.get("/write", _bearer(SECRET))
    assert ok.headers["x-ratelimit-limit"] and denied.headers["x-ratelimit-limit"]
    assert int(denied.headers["x-ratelimit-remaining"]) == int(ok.headers["x-ratelimit-remaining"]) - 1
    fresh = Served()
    fresh.edge.plans.default = RateLimit(per_second=0.001, burst=1, per_minute=100)
    await fresh.get("/read", _bearer(SECRET))
    limited = await fresh.get("/read", _bearer(SECRET))
    assert limited.status == 429 and limited.headers["retry-after"] == "1000" and limited.headers["x-ratelimit-limit"]
    assert [(c.status, c.error_code) for c in fresh.calls()] == [(200, None), (429, "rate_limited")]


async def test_a_sane_request_id_is_kept_and_anything_else_replaced():
    served = Served()
    kept = await served.get("/read", {"X-Request-ID": "trace-42"})
    assert kept.headers["x-request-id"] == "trace-42" == kept.context.request_id
    for bad in ("x" * 129, "", "caf\xe9"):
        replaced = await served.get("/read", {"X-Request-ID": bad})
        new = replaced.headers["x-request-id"]
        assert new != bad and len(new) == 24 and int(new, 16) >= 0 and new == replaced.context.request_id
    made = await served.get("/read")
    assert len(made.headers["x-request-id"]) == 24
    assert request_id_from("a" * 128) == "a" * 128 and request_id_from("tab\there") != "tab\there"


async def test_a_body_too_large_and_an_unhandled_error_have_the_request_id_too():
    served = Served()
    big = await served.get("/echo", {"X-Request-ID": "big-1"}, method="POST", body=b'{"a": "0123456789"}')
    assert big.status == 413 and big.headers["x-request-id"] == "big-1"
    boom = await served.get("/boom", {"X-Request-ID": "boom-1"})
    assert boom.status == 500 and boom.headers["x-request-id"] == "boom-1"


# ---- timing ----------------------------------------------------------------------------------
async def test_the_latency_histogram_is_observed_once_per_request():
    served = Served()
    before = (_observed("/read", 200), _observed("/read", 401), _observed("unmatched", 404), _observed("/boom", 500))
    await served.get("/read", _bearer(SECRET))
    await served.get("/read", _bearer(DISABLED))
    await served.get("/nowhere")
    await served.get("/boom")
    after = (_observed("/read", 200), _observed("/read", 401), _observed("unmatched", 404), _observed("/boom", 500))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1, 1]


# ---- the context alone -----------------------------------------------------------------------
def _call() -> Call:
    return Call(T, uuid.uuid4(), uuid.uuid4(), "GET", "/api/x", 0, "127.0.0.1", "ua", 0.0)


def test_finishing_a_context_without_a_call_does_nothing_and_one_is_made_when_missing():
    CallContext("r", 0.0).finish(200, 0.1)
    scope: dict[str, Any] = {}
    context = context_of(scope)
    assert scope[CALL_CONTEXT] is context and context_of(scope) is context and context.request_id == ""


def test_a_second_call_held_by_one_context_frees_the_first_ones_place():
    recorder = CallRecorder(_settings(), max_buffer=1)
    context = CallContext("r", 0.0)
    context.hold(recorder, _call())
    assert recorder.reserve()
    context.reserved = True
    second = _call()
    context.hold(recorder, second)
    assert not context.reserved and recorder.lanes.open == 0
    assert recorder.reserve()
    context.reserved = True
    context.error_code = "rate_limited"  # not a refusal's status: the code is not the event's
    context.finish(200, 0.0015)
    (call,) = recorder.lanes.take(10)
    assert call is second and (call.status, call.latency_ms, call.error_code) == (200, 1.5, None)


def test_an_admission_is_given_back_once_when_its_call_ends_refused_or_is_replaced_and_kept_otherwise():
    recorder = CallRecorder(_settings())
    given_back: list[str] = []

    def admitted(context: CallContext, name: str) -> None:
        context.hold(recorder, _call())
        assert recorder.reserve()
        context.reserved = True
        context.give_back = lambda: given_back.append(name)

    served, refused, replaced = CallContext("a", 0.0), CallContext("b", 0.0), CallContext("c", 0.0)
    admitted(served, "served")
    served.finish(200, 0.001)  # counted by quota: the admission stays
    admitted(refused, "refused")
    refused.error_code = "insufficient_quota"  # e.g. geo's stock judged in its own transaction
    refused.finish(403, 0.001)
    admitted(replaced, "replaced")
    replaced.hold(recorder, _call())  # a second edge dependency: its own admission follows
    assert replaced.give_back is None
    replaced.finish(200, 0.001)
    assert given_back == ["refused", "replaced"]
