"""(issue 38) A hot route's answer without FastAPI's routing and dependency solving.

A metered API-key call to a route whose whole work is the edge's dependency and one use case
(`GET /api/geo/projects`) spends about as much of the request worker's CPU in FastAPI's machinery
around it (the included router's match, two exit stacks and an exception wrapper per request,
the dependency graph solved for one dependency) as in the edge and the handler together
(BENCHMARKS.md, "http_load", round 24). A service may answer such a route here instead: the same
method and exact path, handled by a function of the request that calls the route's own
dependency (`Edge.requires`) and builds the route's own response. The documented route stays
registered, so the OpenAPI document describes it as before, and anything else (another method,
another path, a trailing slash) goes on to the router unchanged.

It sits in front of the app's router, inside the app's exception handlers (installed by
`install`), so an error the dependency or the use case raises (401, 403, 429, 503...) gets the
answer the route would give: the same handlers turn it into the contract's body.
"""

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from fastapi import FastAPI, routing
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

FastHandler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class FastRoute:
    """`handler` answers `method` `path` exactly as the documented route there does."""

    method: str
    path: str
    handler: FastHandler


class FastRoutes:
    def __init__(self, app: ASGIApp, routes: dict[tuple[str, str], tuple[APIRoute, FastHandler]]) -> None:
        self.app = app
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        route, handler = found
        # what routing would have set (the route: the call's path, the metrics' label)
        scope.update(route=route, endpoint=route.endpoint, path_params={})
        response = await handler(Request(scope, receive, send))
        await response(scope, receive, send)


def _documented(app: FastAPI, method: str, path: str) -> APIRoute:
    """The route the router would take for `method` `path` (as the OpenAPI document walks them)."""
    for context in routing.iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute) and context.path_format == path and method in (context.methods or ()):
            return route
    raise RuntimeError(f"{method} {path} has no documented route: a fast route only answers for one")


def install(app: FastAPI, fast_routes: Iterable[FastRoute]) -> None:
    """In front of the app's router (once every route is included), inside its exception handlers."""
    routes = {(r.method, r.path): (_documented(app, r.method, r.path), r.handler) for r in fast_routes}
    if routes:
        router = app.router
        router.middleware_stack = FastRoutes(router.middleware_stack, routes)
