"""tollgate_client (clients/python) against Tollgate on the real stack, served over real HTTP:
verify's typed verdict, reports that are never counted twice however they are retried, reservations
that settle with the actual quantity or are released on an exception, and the ASGI middleware
that protects a whole app."""

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from contracts.common import Resource
from tests.integration.test_edge_verify import service_token
from tests.integration.test_ingress_snippets import Stage, stage  # noqa: F401 - the fixture
from tests.integration.test_keys_api import new_key, signup
from tests.support.apps import free_port
from tests.support.metering import wait_until
from tollgate_client import (
    AsyncTollgate,
    InsufficientQuota,
    Retry,
    Tollgate,
    TollgateError,
    TollgateMiddleware,
    UsageEvent,
    Verdict,
)

pytestmark = pytest.mark.integration
QUICK = Retry(attempts=4, initial=0.01, maximum=0.05)


async def _writer(stage: Stage) -> str:  # noqa: F811
    settings = stage.app.state.runtime.settings  # type: ignore[attr-defined]
    return await service_token(stage.client, settings, ["keys:verify", "usage:write"], name="client-test")


def _position(stage: Stage, account_id: uuid.UUID) -> tuple[int, int, int]:  # noqa: F811
    """(used, reserved, total) of ai_tokens as the edge's quota.v1 projection holds them."""
    edge = stage.app.state.runtime.edge  # type: ignore[attr-defined]
    return tuple(edge.quota.position(account_id, Resource.AI_TOKENS, datetime.now(UTC)))  # type: ignore[return-value]


async def _until_position(stage: Stage, account_id: uuid.UUID, used: int, reserved: int) -> None:  # noqa: F811
    async def reached() -> bool:
        return _position(stage, account_id)[:2] == (used, reserved)

    await wait_until(reached, timeout=30)


class LoseFirstAnswers(httpx.AsyncBaseTransport):
    """Sends every request to Tollgate for real, but loses the answer of the first `lose` ones
    (a read timeout after Tollgate did the work): what a retry must survive."""

    def __init__(self, lose: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lose = lose
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.bodies.append(body)
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.lose > 0:
            self.lose -= 1
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_verify_answers_a_typed_verdict_sync_and_async(stage: Stage):  # noqa: F811
    token = await _writer(stage)
    account, owner = await signup(stage.client)
    key = await new_key(stage.client, owner)
    disabled = await new_key(stage.client, owner)
    await stage.client.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)
    ask: dict[str, Any] = {"method": "POST", "path": "/v1/chat/completions", "ip": "203.0.113.9", "resource": "ai_tokens"}

    async with AsyncTollgate(f"http://{stage.tollgate}", token) as tollgate:
        valid = await tollgate.verify(key["key"], **ask)
        refused = await tollgate.verify(disabled["key"], **ask)
    assert isinstance(valid, Verdict) and valid.valid and valid.code == "valid" and valid.status == 200
    assert valid.account_id == uuid.UUID(account["id"]) and valid.api_key_id == uuid.UUID(key["id"])
    assert valid.plan == "free" and valid.role == "owner"
    assert valid.rate_limit is not None and valid.rate_limit.limit > 0
    assert valid.quota is not None and valid.quota.resource == "ai_tokens" and valid.quota.status == "available"
    assert (refused.valid, refused.status, refused.code) == (False, 401, "api_key_disabled")
    assert refused.error is not None and refused.error["error"]["code"] == "api_key_disabled"
    assert refused.headers()["WWW-Authenticate"] == "Bearer"

    def blocking() -> Verdict:
        with Tollgate(f"http://{stage.tollgate}", token) as tollgate:
            return tollgate.verify("sk-" + uuid.uuid4().hex * 2, **ask)

    unknown = await asyncio.to_thread(blocking)
    assert (unknown.valid, unknown.code, unknown.account_id) == (False, "invalid_api_key", None)


async def test_a_report_whose_answer_was_lost_is_retried_with_the_same_ids_and_counted_once(stage: Stage):  # noqa: F811
    token = await _writer(stage)
    account, owner = await signup(stage.client)
    account_id = uuid.UUID(account["id"])
    events = [
        UsageEvent(account_id, "ai_tokens", 100, provider="openai", model="gpt-4o", input_tokens=60, output_tokens=40)
        for _ in range(5)
    ]
    lossy = LoseFirstAnswers(lose=1)
    async with AsyncTollgate(f"http://{stage.tollgate}", token, batch_size=2, retry=QUICK, transport=lossy) as tollgate:
        result = await tollgate.report(events)
        # The first batch's answer was lost and it was sent again, the same ids: Tollgate had them.
        assert (result.accepted, result.duplicates) == (3, 2)
        assert len(lossy.bodies) == 4 and lossy.bodies[0] == lossy.bodies[1]
        # The caller retrying the whole report (it saw an error) counts nothing twice either.
        again = await tollgate.report(events)
        assert (again.accepted, again.duplicates) == (0, 5)

    await _until_position(stage, account_id, used=500, reserved=0)  # quota: once each

    async def overview() -> dict | None:  # ClickHouse, through the metering sink: once each
        answer = (await stage.client.get("/api/ai/usage/overview", params={"range": "today"}, headers=owner)).json()
        return answer if answer["total_tokens"] >= 500 else None

    assert (await wait_until(overview, timeout=30))["total_tokens"] == 500
    await asyncio.sleep(1)  # nothing more arrives later
    assert _position(stage, account_id)[0] == 500


async def test_a_reservation_settles_with_the_actual_quantity(stage: Stage):  # noqa: F811
    token = await _writer(stage)
    account, owner = await signup(stage.client)
    account_id = uuid.UUID(account["id"])
    key = await new_key(stage.client, owner)
    async with AsyncTollgate(f"http://{stage.tollgate}", token) as tollgate:
        async with tollgate.reserve(account_id, "ai_tokens", 5_000, ttl=60) as hold:
            await _until_position(stage, account_id, used=0, reserved=5_000)
            key_id = uuid.UUID(key["id"])
            hold.settle(1_200, input_tokens=200, output_tokens=1_000, provider="openai", model="gpt-4o", api_key_id=key_id)
        await _until_position(stage, account_id, used=1_200, reserved=0)

        # More than is left: refused before anything is spent, with the contract's details.
        with pytest.raises(InsufficientQuota) as refused:
            async with tollgate.reserve(account_id, "ai_tokens", 10**9, ttl=60):
                pytest.fail("entered a reservation that does not fit")
        assert refused.value.status == 403 and refused.value.details["resource"] == "ai_tokens"


async def test_a_reservation_is_released_on_an_exception_sync_and_async(stage: Stage):  # noqa: F811
    token = await _writer(stage)
    account, _owner = await signup(stage.client)
    account_id = uuid.UUID(account["id"])

    class Boom(Exception):
        pass

    async with AsyncTollgate(f"http://{stage.tollgate}", token) as tollgate:
        with pytest.raises(Boom):
            async with tollgate.reserve(account_id, "ai_tokens", 7_000, ttl=600):
                await _until_position(stage, account_id, used=0, reserved=7_000)
                raise Boom
    await _until_position(stage, account_id, used=0, reserved=0)

    loop = asyncio.get_running_loop()

    def blocking() -> None:
        with Tollgate(f"http://{stage.tollgate}", token) as tollgate, tollgate.reserve(account_id, "ai_tokens", 9_000, ttl=600):
            asyncio.run_coroutine_threadsafe(_until_position(stage, account_id, used=0, reserved=9_000), loop).result(30)
            raise Boom

    with pytest.raises(Boom):
        await asyncio.to_thread(blocking)
    await _until_position(stage, account_id, used=0, reserved=0)


async def test_a_settlement_tollgate_refuses_releases_the_hold_sync_and_async(stage: Stage):  # noqa: F811
    token = await _writer(stage)
    account, _owner = await signup(stage.client)
    account_id = uuid.UUID(account["id"])
    async with AsyncTollgate(f"http://{stage.tollgate}", token) as tollgate:
        with pytest.raises(TollgateError) as refused:
            async with tollgate.reserve(account_id, "ai_tokens", 6_000, ttl=600) as hold:
                await _until_position(stage, account_id, used=0, reserved=6_000)
                hold.settle(1_000, input_tokens=10, output_tokens=20)  # does not add up: a 422
        assert refused.value.status == 422
    await _until_position(stage, account_id, used=0, reserved=0)  # not held until the ttl

    loop = asyncio.get_running_loop()

    def blocking() -> None:
        with (
            Tollgate(f"http://{stage.tollgate}", token) as tollgate,
            tollgate.reserve(account_id, "ai_tokens", 8_000, ttl=600) as hold,
        ):
            asyncio.run_coroutine_threadsafe(_until_position(stage, account_id, used=0, reserved=8_000), loop).result(30)
            hold.settle(1_000, input_tokens=10, output_tokens=20)

    with pytest.raises(TollgateError):
        await asyncio.to_thread(blocking)
    await _until_position(stage, account_id, used=0, reserved=0)


def _protected_app(**middleware: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(TollgateMiddleware, **middleware)

    @app.get("/items/{item_id}")
    async def item(item_id: str, request: Request) -> dict[str, str]:
        verdict: Verdict = request.state.tollgate
        return {"item": item_id, "account": str(verdict.account_id), "key": str(verdict.api_key_id)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def test_the_middleware_protects_a_whole_app_in_one_line(stage: Stage):  # noqa: F811
    token = await _writer(stage)
    account, owner = await signup(stage.client)
    key = await new_key(stage.client, owner)
    disabled = await new_key(stage.client, owner)
    await stage.client.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)
    tollgate = AsyncTollgate(f"http://{stage.tollgate}", token, source="items")
    app = _protected_app(tollgate=tollgate)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://items.test") as http:
        admitted = await http.get("/items/42", headers={"Authorization": f"Bearer {key['key']}"})
        assert admitted.status_code == 200, admitted.text
        assert admitted.json() == {"item": "42", "account": account["id"], "key": key["id"]}
        assert int(admitted.headers["x-ratelimit-limit"]) > 0

        for headers, status, code in (
            ({}, 401, "missing_credentials"),
            ({"Authorization": f"Bearer {disabled['key']}"}, 401, "api_key_disabled"),
            ({"Authorization": "Bearer sk-" + "x" * 600}, 401, "invalid_api_key"),
        ):
            refused = await http.get("/items/42", headers=headers)
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
            assert refused.headers["www-authenticate"] == "Bearer"
        assert (await http.get("/healthz")).status_code == 200  # excluded: no key needed

    async def logged() -> list | None:  # the call is logged under its route template
        items = (await stage.client.get("/api/activity-log", headers=owner)).json()["items"]
        return items if any(i["path"] == "/items/{item_id}" and i["status"] == 200 for i in items) else None

    await wait_until(logged, timeout=30)
    await tollgate.aclose()

    # Tollgate unreachable: refused with the contract's 503, never served unverified.
    nowhere = AsyncTollgate(f"http://127.0.0.1:{free_port()}", token, retry=QUICK)
    unverifiable = httpx.ASGITransport(app=_protected_app(tollgate=nowhere))
    async with httpx.AsyncClient(transport=unverifiable, base_url="http://x") as http:
        down = await http.get("/items/1", headers={"Authorization": f"Bearer {key['key']}"})
    assert (down.status_code, down.json()["error"]["code"], down.headers["retry-after"]) == (503, "service_unavailable", "1")
    await nowhere.aclose()


async def test_the_middleware_behind_an_ingress_reads_its_verdict():
    app = _protected_app(trust_ingress=True)
    account, key = uuid.uuid4(), uuid.uuid4()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://items.test") as http:
        named = {"X-Tollgate-Account": str(account), "X-Tollgate-Key": str(key), "X-Tollgate-Role": "owner"}
        admitted = await http.get("/items/7", headers=named)
        assert admitted.json() == {"item": "7", "account": str(account), "key": str(key)}
        around = await http.get("/items/7")  # reached without the ingress: refused, not served
        assert (around.status_code, around.json()["error"]["code"]) == (503, "service_unavailable")
