"""Routing a request path seen before without scanning every route again.

FastAPI matches a request against each included router in turn, each against all of its routes,
and then once more inside the router that matched. For a route late in the app (every service's
router comes after health's) that is some fifty matches per request: measured in process, more
CPU than a refused API-key call's own work (a 401 cost 2.4x a /healthz, 1.3x once its router
came first). The app's routes do not change after start, so which top-level router fully matches
a method and path is a fact worth remembering: the next request with them goes straight to that
router, which still matches inside itself (path parameters, the endpoint) exactly as before.

Only included routers are remembered: their match adds nothing to the scope (their own handling
does). Anything else (the docs' plain routes, a 404, a 405, a slash redirect) takes the router's
own path, unchanged.
"""

from fastapi import FastAPI
from fastapi.routing import APIRouter
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

MAX_REMEMBERED = 10_000  # paths carry ids: bounded, forgotten all at once when full


class RememberedRoutes:
    """The app router's dispatch, with the top-level router of each (method, path) remembered."""

    def __init__(self, router: APIRouter) -> None:
        self._router = router
        self._routes: dict[tuple[str, str], BaseRoute] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._router.app(scope, receive, send)
            return
        key = (scope["method"], scope["path"])
        route = self._routes.get(key)
        if route is None:
            route = self._first_full_match(scope)
            if route is None:
                await self._router.app(scope, receive, send)
                return
            if len(self._routes) >= MAX_REMEMBERED:
                self._routes.clear()
            self._routes[key] = route
        scope.setdefault("router", self._router)
        await route.handle(scope, receive, send)

    def _first_full_match(self, scope: Scope) -> BaseRoute | None:
        """The route the router itself would take, if it is an included router (an empty child scope)."""
        for route in self._router.routes:
            match, child_scope = route.matches(scope)
            if match == Match.FULL:
                return route if not child_scope else None
        return None


def remember_routes(app: FastAPI) -> None:
    """Install in front of the app's router, once its routes are all included (the router has no
    middleware or form limits of its own that a remembered dispatch would skip)."""
    router = app.router
    if router.middleware_stack != router.app or getattr(router, "form_limits", None):
        raise RuntimeError("the app's router has middleware or form limits of its own; remembering routes would skip them")
    router.middleware_stack = RememberedRoutes(router)
