"""TollgateMiddleware(trust_ingress=True) reached around its ingress with made-up X-Tollgate-*
headers that are not ids: refused like a request without them (503, the contract's body), not an
unhandled ValueError (a 500 from the server, a traceback per request)."""

import uuid

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tollgate_client import TollgateMiddleware


async def _item(request: Request) -> JSONResponse:
    return JSONResponse({"account": str(request.state.tollgate.account_id)})


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Tollgate-Account": "not-an-id", "X-Tollgate-Key": str(uuid.uuid4())},
        {"X-Tollgate-Account": str(uuid.uuid4()), "X-Tollgate-Key": "1 OR 1=1"},
        {"X-Tollgate-Account": str(uuid.uuid4()), "X-Tollgate-Key": str(uuid.uuid4()), "X-Tollgate-User": "x"},
    ],
)
async def test_headers_that_are_not_ids_are_refused_503(headers: dict[str, str]) -> None:
    app = TollgateMiddleware(Starlette(routes=[Route("/items", _item)]), trust_ingress=True)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://items.test") as http:
        refused = await http.get("/items", headers=headers)
    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "service_unavailable")
