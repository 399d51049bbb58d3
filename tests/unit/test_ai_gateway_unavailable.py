"""examples/ai-gateway and tollgate_client when Tollgate cannot take a reservation (503
`overloaded` or `service_unavailable`, with `Retry-After`): the official `openai` package, talking
to the gateway in process, gets Tollgate's 503 with its code and its Retry-After, which openai's
own retries honour. Tollgate is a fake here (httpx.MockTransport): it admits the key and answers
every reservation 503."""

import sys
from typing import Any
from uuid import UUID

import httpx
import openai
import pytest

from tests.support.apps import REPO
from tollgate_client import AsyncTollgate, Retry, TollgateUnavailable

sys.path.insert(0, str(REPO / "examples" / "ai-gateway"))
from ai_gateway.app import GatewaySettings, create_app

ACCOUNT, KEY = "6d3f3a52-6a0e-4d4b-9a55-2d4b0c1c2f10", "0b5c1f7e-96a4-4d8e-8c1e-5a3f2b7d9e01"
VALID = {"valid": True, "code": "valid", "status": 200, "account_id": ACCOUNT, "api_key_id": KEY}


def _overloaded_tollgate() -> tuple[httpx.MockTransport, list[str]]:
    """Admits every key; refuses every reservation 503 overloaded, naming its wait (0 s until the
    last attempt, so that the client's retries take no time here, then 7 s)."""
    reservations: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/edge/verify":
            return httpx.Response(200, json=VALID)
        reservations.append(request.method)
        body: dict[str, Any] = {"error": {"code": "overloaded", "message": "busy", "request_id": "r1"}}
        return httpx.Response(503, json=body, headers={"Retry-After": "7" if len(reservations) == 5 else "0"})

    return httpx.MockTransport(answer), reservations


async def test_the_client_raises_tollgates_own_503_with_its_retry_after():
    transport, reservations = _overloaded_tollgate()
    async with AsyncTollgate("http://tollgate.test", "st-x", transport=transport) as tollgate:
        with pytest.raises(TollgateUnavailable) as raised:
            async with tollgate.reserve(UUID(ACCOUNT), "ai_tokens", 10):
                pass
    assert len(reservations) == 5  # a 503 is retried: Tollgate did nothing
    error = raised.value
    assert (error.status, error.code, error.request_id) == (503, "overloaded", "r1")
    assert error.headers["retry-after"] == "7"


async def test_a_transport_failure_is_unavailable_with_a_retry_after_under_its_http_name():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    quick = Retry(attempts=2, initial=0.001)
    async with AsyncTollgate("http://tollgate.test", "st-x", retry=quick, transport=httpx.MockTransport(refuse)) as tollgate:
        with pytest.raises(TollgateUnavailable) as raised:
            await tollgate.release(UUID(KEY))
    assert (raised.value.code, raised.value.headers["retry-after"]) == ("service_unavailable", "1")


async def test_openai_gets_the_gateways_503_with_tollgates_code_and_retry_after():
    transport, _ = _overloaded_tollgate()
    gateway = create_app(GatewaySettings("http://tollgate.test", "st-x"), transport=transport)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gateway.test")
    ai = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key="sk-" + "a" * 43, max_retries=0, http_client=http)
    async with http:
        with pytest.raises(openai.InternalServerError) as raised:
            await ai.chat.completions.create(model="parrot-1", messages=[{"role": "user", "content": "hi"}])
    response = raised.value.response
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "overloaded"
    assert response.headers.get("retry-after") == "7"
