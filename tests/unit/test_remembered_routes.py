"""A remembered route answers exactly what FastAPI's full scan answers, the first time and after."""

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from services.runtime.host.routing import MAX_REMEMBERED, RememberedRoutes, remember_routes

REQUESTS = [
    ("GET", "/healthz"),
    ("GET", "/api/keys/stats"),  # a static path before a parameter's in the same router
    ("GET", "/api/keys/7"),
    ("GET", "/api/keys/8"),
    ("DELETE", "/api/keys/7"),
    ("POST", "/api/keys/7"),  # 405: the path matches, the method does not
    ("GET", "/api/geo/projects"),
    ("POST", "/api/geo/projects"),
    ("GET", "/api/geo/projects/"),  # the slash redirect
    ("GET", "/api/shadowed"),  # two routers have it: the first one included wins
    ("GET", "/nowhere"),
    ("GET", "/openapi.json"),
]


def build() -> FastAPI:
    app = FastAPI()
    health, keys, geo, late = APIRouter(), APIRouter(), APIRouter(), APIRouter()
    health.add_api_route("/healthz", lambda: {"ok": True})
    keys.add_api_route("/api/keys/stats", lambda: {"stats": 1})
    keys.add_api_route("/api/keys/{key_id}", lambda key_id: {"get": key_id})
    keys.add_api_route("/api/keys/{key_id}", lambda key_id: {"delete": key_id}, methods=["DELETE"])
    keys.add_api_route("/api/shadowed", lambda: {"from": "keys"}, operation_id="shadowed_keys")
    geo.add_api_route("/api/geo/projects", lambda: {"projects": []})
    geo.add_api_route("/api/geo/projects", lambda: {"created": True}, methods=["POST"], status_code=201)
    late.add_api_route("/api/shadowed", lambda: {"from": "late"}, operation_id="shadowed_late")
    for router in (health, keys, geo, late):
        app.include_router(router)
    return app


async def answers(app: FastAPI) -> list[tuple[int, str, str | None]]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        out = []
        for _ in range(2):  # the second round is served from what the first remembered
            for method, path in REQUESTS:
                r = await client.request(method, path, follow_redirects=False)
                out.append((r.status_code, r.text, r.headers.get("location")))
        return out


async def test_remembered_dispatch_answers_what_the_full_scan_answers() -> None:
    plain, remembering = build(), build()
    remember_routes(remembering)
    expected = await answers(plain)
    assert [status for status, _, _ in expected[: len(REQUESTS)]] == [200, 200, 200, 200, 200, 405, 200, 201, 307, 200, 404, 200]
    assert expected[9][1] == '{"from":"keys"}'
    assert await answers(remembering) == expected
    assert isinstance(remembering.router.middleware_stack, RememberedRoutes)


async def test_only_included_routers_are_remembered_and_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    app = build()
    remember_routes(app)
    memo = app.router.middleware_stack
    assert isinstance(memo, RememberedRoutes)
    monkeypatch.setattr("services.runtime.host.routing.MAX_REMEMBERED", 3)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in ("/openapi.json", "/nowhere", "/api/keys/1"):
            await client.get(path)
        assert set(memo._routes) == {("GET", "/api/keys/1")}  # the docs' plain route and a 404 are not
        for n in range(2, 6):
            assert (await client.get(f"/api/keys/{n}")).json() == {"get": str(n)}
        assert len(memo._routes) <= 3
    assert MAX_REMEMBERED >= 1000


def test_a_router_with_middleware_of_its_own_is_refused() -> None:
    app = build()
    app.router.middleware_stack = lambda *_: None  # type: ignore[assignment,method-assign]
    with pytest.raises(RuntimeError):
        remember_routes(app)
