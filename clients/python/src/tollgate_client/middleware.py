"""An ASGI middleware that protects a whole app (FastAPI, Starlette, any ASGI app) with Tollgate:

    app.add_middleware(TollgateMiddleware, tollgate=AsyncTollgate(url, token))

Each HTTP request's `Authorization: Bearer sk-...` is verified (POST /api/edge/verify); a refusal
is answered as a route inside Tollgate would answer it (status, the contract's error body,
`Retry-After`, `X-RateLimit-*`, `WWW-Authenticate`) and never reaches the app; an admitted call
reaches it with the verdict on `request.state.tollgate` (`scope["state"]["tollgate"]`).

Behind an ingress that already asked Tollgate (the shipped nginx `auth_request` or Caddy
`forward_auth` snippets), verifying again would meter every call twice: `trust_ingress=True`
reads the verdict from the `X-Tollgate-*` headers the ingress sets instead (it overwrites any a
caller sent). Then the app must be reachable only through that ingress."""

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any
from urllib.parse import quote
from uuid import UUID

from tollgate_client.client import AsyncTollgate
from tollgate_client.errors import TollgateError, TollgateUnavailable
from tollgate_client.types import Verdict

log = logging.getLogger("tollgate_client")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNREACHABLE = Verdict(
    valid=False,
    code="service_unavailable",
    status=503,
    retry_after=1,
    error={"error": {"code": "service_unavailable", "message": "Tollgate could not be asked; retry shortly"}},
)
MISCONFIGURED = Verdict(
    valid=False,
    code="service_unavailable",
    status=503,
    retry_after=1,
    error={"error": {"code": "service_unavailable", "message": "This service cannot verify keys right now"}},
)
INVALID_KEY = Verdict(
    valid=False,
    code="invalid_api_key",
    status=401,
    error={"error": {"code": "invalid_api_key", "message": "The API key is not valid."}},
)
MAX_KEY = 512  # verify's limit: a longer credential is no key of Tollgate's
NOT_BEHIND_INGRESS = Verdict(
    valid=False,
    code="service_unavailable",
    status=503,
    retry_after=1,
    error={"error": {"code": "service_unavailable", "message": "This service is reachable only through its ingress"}},
)


def _printable(path: str) -> str:
    """verify takes printable ASCII without spaces: anything else percent-encoded, at most 512."""
    return "".join(c if "\x21" <= c <= "\x7e" else quote(c) for c in path)[:512]


def _address(scope: Scope) -> str:
    client = scope.get("client")
    try:
        return str(ipaddress.ip_address(client[0])) if client else "0.0.0.0"  # noqa: S104 - an address, not a bind
    except ValueError:  # a test client's made-up host name
        return "0.0.0.0"  # noqa: S104


def route_template(scope: Scope) -> str:
    """The route the request will reach (`/v1/items/{id}`), as calls.v1 and the activity log want
    it; the raw path when the app is not Starlette's or no route matches. A mounted sub-app's
    route is the mount's prefix joined to the sub-app's own template (`/v1` + `/items/{id}`),
    never the prefix alone: a key's allowed_routes judge this path, and every path under the mount
    would otherwise be judged as the mount's (`GET /v1`)."""
    path = _printable(str(scope.get("path") or "/"))
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", None)
    if routes:
        found = _template(routes, scope)
        if found is not None:
            return _printable(found)
    return path[:512]


def _template(routes: Any, scope: Scope) -> str | None:
    """The template of the route among `routes` that fully matches `scope`, a mount's joined to its
    own routes' (None: no route matches, or none inside the mount that matched)."""
    try:
        from starlette.routing import Match
    except ImportError:  # pragma: no cover - starlette is how an app has routes
        return None
    for route in routes:
        match, child = route.matches(scope)
        if match is not Match.FULL:
            continue
        inner = getattr(route, "routes", None)  # a Mount (or a Host): its own routes decide
        if inner is None:
            return str(getattr(route, "path", scope.get("path") or "/"))
        found = _template(inner, {**scope, **child}) if inner else None
        return None if found is None else str(getattr(route, "path", "")) + found
    return None


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


def _bearer(scope: Scope) -> str:
    scheme, _, token = _header(scope, b"authorization").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _ingress_verdict(scope: Scope) -> Verdict:
    """The admitted caller the ingress named in X-Tollgate-* (it sends refusals back itself)."""
    account, key = _header(scope, b"x-tollgate-account"), _header(scope, b"x-tollgate-key")
    if not account or not key:
        log.error("trust_ingress: a request without X-Tollgate-Account/-Key: is the app reachable around its ingress?")
        return NOT_BEHIND_INGRESS
    user = _header(scope, b"x-tollgate-user")
    try:
        account_id, api_key_id, user_id = UUID(account), UUID(key), UUID(user) if user else None
    except ValueError:  # not the ingress's (it sends ids): someone reached the app around it
        log.error("trust_ingress: X-Tollgate-* headers that are not ids: is the app reachable around its ingress?")
        return NOT_BEHIND_INGRESS
    return Verdict(
        valid=True,
        code="valid",
        status=200,
        account_id=account_id,
        api_key_id=api_key_id,
        user_id=user_id,
        role=_header(scope, b"x-tollgate-role") or None,
        plan=_header(scope, b"x-tollgate-plan") or None,
    )


async def _answer_refusal(verdict: Verdict, send: Send) -> None:
    body = json.dumps(verdict.error or {"error": {"code": verdict.code, "message": verdict.code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), value.encode()) for name, value in verdict.headers().items()]
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TollgateMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        tollgate: AsyncTollgate | None = None,
        trust_ingress: bool = False,
        resource: str | None = None,
        cost: int = 0,
        permission: str | None = None,
        model: str | None = None,
        exclude: Collection[str] = ("/healthz", "/readyz"),
    ) -> None:
        """`resource` (+ `cost`) gates every call on that quota; `permission` is one the key's user
        must hold; `model` (`provider/model`) is the model this service will call, judged by the
        key's allowed models: the service's own choice, never what its caller names in the body or
        the query; `exclude` lists paths served without a key (health checks)."""
        if (tollgate is None) == (not trust_ingress):
            raise ValueError("give either `tollgate` (verify each call) or `trust_ingress=True`")
        self.app = app
        self.tollgate = tollgate
        self.resource, self.cost, self.permission, self.model = resource, cost, permission, model
        self.exclude = frozenset(exclude)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.exclude:
            await self.app(scope, receive, send)
            return
        verdict = await self._verdict(scope)
        if not verdict.valid:
            await _answer_refusal(verdict, send)
            return
        scope.setdefault("state", {})["tollgate"] = verdict
        extra = [(name.lower().encode(), value.encode()) for name, value in verdict.headers().items()]

        async def send_with_rate_limit(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_rate_limit)

    async def _verdict(self, scope: Scope) -> Verdict:
        if self.tollgate is None:
            return _ingress_verdict(scope)
        key = _bearer(scope)
        if len(key) > MAX_KEY:
            return INVALID_KEY
        try:
            return await self.tollgate.verify(
                key,
                method=str(scope.get("method", "GET")),
                path=route_template(scope),
                ip=_address(scope),
                user_agent=_header(scope, b"user-agent"),
                resource=self.resource,
                cost=self.cost,
                permission=self.permission,
                model=self.model,
            )
        except TollgateUnavailable as error:
            log.error("Tollgate unreachable, refusing the call: %s", error)
            return UNREACHABLE  # closed, never open: an unverified call is never served
        except TollgateError as error:  # this service's token or settings, not the caller
            log.error("Tollgate refused this service's verify (%s): check its token and settings", error)
            return MISCONFIGURED
