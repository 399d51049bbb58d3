"""The Python client's middleware sends verify the route template of the request: inside a mounted
sub-app (`app.mount("/v1", sub)`) that is the mount's prefix joined to the sub-app's own route,
never the prefix alone. Sent as `/v1`, every path under the mount was judged as `GET /v1`: a key
allowed exactly `GET /v1` reached `/v1/admin/delete`, and a key allowed `GET /v1/*` none of them
(fresh-eyes review 2, finding F2)."""

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from tollgate_client import AsyncTollgate, TollgateMiddleware
from tollgate_client.middleware import route_template


async def _ok(_request: Any) -> PlainTextResponse:
    return PlainTextResponse("ok")


def _app() -> FastAPI:
    admin = Starlette(routes=[Route("/admin/{item}/delete", _ok), Mount("/deep", routes=[Route("/x", _ok)])])
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> str:
        return "models"

    app.mount("/v1", admin)
    return app


def _scope(app: Any, path: str) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "root_path": "", "headers": [], "app": app}


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/models", "/v1/models"),
        ("/v1/admin/7/delete", "/v1/admin/{item}/delete"),
        ("/v1/deep/x", "/v1/deep/x"),
        ("/v1/nothing-here", "/v1/nothing-here"),  # no route of the sub-app: the path itself
        ("/elsewhere", "/elsewhere"),
    ],
)
def test_a_mounted_route_is_named_by_its_whole_template(path: str, template: str) -> None:
    assert route_template(_scope(_app(), path)) == template


async def test_verify_is_asked_about_the_mounted_route() -> None:
    asked: list[dict[str, Any]] = []

    def tollgate(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        refused = {"code": "route_not_allowed", "message": "no", "request_id": "r"}
        return httpx.Response(200, json={"valid": False, "code": "route_not_allowed", "status": 403, "error": {"error": refused}})

    app = _app()
    client = AsyncTollgate("http://tollgate.test", "st-x", transport=httpx.MockTransport(tollgate))
    app.add_middleware(TollgateMiddleware, tollgate=client, model=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc.test") as http:
        answer = await http.get("/v1/admin/7/delete", headers={"Authorization": "Bearer sk-" + "a" * 43})
    assert answer.status_code == 403
    assert [a["path"] for a in asked] == ["/v1/admin/{item}/delete"]
