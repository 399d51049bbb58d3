"""The OpenAPI document says, on every operation, which credentials it takes.

The edge's dependencies carry the schemes they accept (`accepts`); the document's generator
walks each route's dependencies and writes them as the operation's `security` (one alternative
per scheme). A route without any is public (`security: []`).
"""

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi

API_KEY = "ApiKey"
CONSOLE_SESSION = "ConsoleSession"
SERVICE_TOKEN = "ServiceToken"  # noqa: S105 - scheme names, not secrets
ADMIN_TOKEN = "AdminToken"  # noqa: S105
INGRESS_SERVICE_TOKEN = "IngressServiceToken"  # noqa: S105

SCHEMES: dict[str, dict[str, str]] = {
    API_KEY: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "sk-...",
        "description": (
            "A customer's API key: `sk-` + at least 40 URL-safe characters; acts with its owner's current role. "
            "Its answers carry X-RateLimit-Limit, -Remaining and -Reset, describing the rate limit that binds: on a "
            "429 the one that refused (Remaining 0), otherwise the one with the least room left, of the plan's token "
            "bucket and one-minute sliding window, per account and per key. Limit: that limit's size in calls (the "
            "bucket's `burst`, or `per_minute`). Remaining: calls it still lets through now. Reset: whole seconds "
            "(relative) until, with no more calls, it is whole again (Remaining back to Limit: the bucket refilled, or "
            "the window empty, up to 120 s); on a 429 at least Retry-After."
        ),
    },
    CONSOLE_SESSION: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "tg1.<payload>.<signature>",
        "description": "A console session from POST /api/auth/login (never starts with `sk-`).",
    },
    SERVICE_TOKEN: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "st-...",
        "description": "A platform service's token (`st-`, scope `usage:write` or `keys:verify`); never held by a customer.",
    },
    INGRESS_SERVICE_TOKEN: {
        "type": "apiKey",
        "in": "header",
        "name": "X-Tollgate-Service-Token",
        "description": "The ServiceToken (`st-`, scope `keys:verify`) of an ingress that asks authorize; "
        "its own header, since Authorization carries the caller's key.",
    },
    ADMIN_TOKEN: {
        "type": "http",
        "scheme": "bearer",
        "description": "The operator's ADMIN_TOKEN setting (the /api/admin routes answer 404 while it is unset).",
    },
}

_ATTRIBUTE = "__tollgate_security__"
D = TypeVar("D", bound=Callable[..., Any])


def accepts(dependency: D, *schemes: str) -> D:
    """Mark a credential-checking dependency with the schemes it accepts."""
    setattr(dependency, _ATTRIBUTE, schemes)
    return dependency


def _schemes_of(dependant: Dependant) -> Iterator[str]:
    for sub in dependant.dependencies:
        yield from getattr(sub.call, _ATTRIBUTE, ())
        yield from _schemes_of(sub)


def route_schemes(dependant: Dependant) -> list[str]:
    """The schemes a route accepts, in a stable order, without repeats."""
    found: list[str] = []
    for scheme in _schemes_of(dependant):
        if scheme not in found:
            found.append(scheme)
    return found


def install(app: FastAPI) -> None:
    """Replace the app's OpenAPI generator by one that also declares the security schemes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        document.setdefault("components", {})["securitySchemes"] = SCHEMES
        paths = document.get("paths", {})
        # Routes of included routers are reached through FastAPI's own walk (as get_openapi does).
        for route in routing.iter_route_contexts(app.routes):
            if not isinstance(route.original_route, routing.APIRoute) or not route.include_in_schema:
                continue
            security: list[dict[str, list[str]]] = [{scheme: []} for scheme in route_schemes(route.dependant)]
            for method in route.methods or ():
                operation = paths.get(route.path_format, {}).get(method.lower())
                if operation is not None:
                    operation["security"] = security
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
