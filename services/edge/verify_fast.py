"""(issue 38, decision 5) verify's and authorize's answers without FastAPI's routing, dependency
solving and validation layers.

A verified call is an admitted, metered call that a service outside Tollgate asks about: its
own work is `Edge.decide` (one Redis round trip, the calls.v1 event). Around it, the documented
routes (verify_api.py) cost the request worker about as much again: the route match, the
dependency graph of the service token, the body's field, the response model's revalidation
(BENCHMARKS.md, "verify", profiles). This answers the calls that need none of it, the hot case:
`POST /api/edge/verify` with a JSON body that the contract's `VerifyRequest` accepts and a live
`st-` token with `keys:verify`; `GET /api/edge/authorize` with a live ingress token and forwarded
headers that the same model accepts. It answers with the very functions the routes use
(`answer_json`: `answer_of`'s bytes; `Ingress`), so a verdict is the same bytes whichever way it went.

Every other request (a missing, unknown or customer's credential, a token without the scope, a
body that is not JSON or not valid, another content type, Envoy's `/authorize/{path}` shape, a
client gone mid-body) goes on to the documented routes with its body replayed, before anything
is decided or counted: their answers (401, 403, 422, and the ingress's error marks) stay those
of the routes by construction, and the OpenAPI document keeps describing both endpoints.

It sits in front of the app's router, inside the app's exception handlers (installed by
`install`), so an error raised while deciding (a dependency down) gets the routes' answer too.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.common import ServiceScope
from contracts.credentials import SERVICE_TOKEN_PREFIX
from contracts.edge_api import VerifyRequest
from services.edge.calls import forwarded_for
from services.edge.context import context_of
from services.edge.edge import Edge
from services.edge.errors import ApiError
from services.edge.service_tokens import ServicePrincipal
from services.edge.verify_api import (
    AUTHORIZE_PATH,
    VERIFY_PATH,
    Ingress,
    answer_json,
    bearer_token,
    forwarded_request,
    service_call,
    standing_of,
)

JSON_TYPE = b"application/json"
_SCOPE = ServiceScope.KEYS_VERIFY


@dataclass(frozen=True, slots=True)
class _Route:
    """What routing would put in the scope for the metrics' label: the route's template."""

    path: str


def parse_verify_body(body: bytes, content_type: str | None) -> VerifyRequest | None:
    """verify's body as the documented route reads it (JSON, then the contract's model), or None
    for anything that route would not accept as it stands: the route then answers it itself.
    Only plain `application/json` is read here (any other type the route judges)."""
    if content_type is None or content_type.lower() != "application/json":
        return None
    try:
        document = json.loads(body)  # as Starlette's Request.json(): bytes, encoding detected
    except Exception:  # not JSON, or not decodable, or nested past the recursion limit: the route's 422
        return None
    if type(document) is not dict:
        return None
    try:
        return VerifyRequest.model_validate(document)
    except ValidationError:
        return None


class VerifyFastPath:
    def __init__(self, app: ASGIApp, edge: Edge) -> None:
        self.app = app
        self.edge = edge
        self._ingress = Ingress(edge)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if path == VERIFY_PATH and method == "POST":
                await self._verify(scope, receive, send)
                return
            if path == AUTHORIZE_PATH and method == "GET":
                await self._authorize(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _service(self, token: str) -> ServicePrincipal | None:
        """The live service of `token` with keys:verify; None: the route answers (and logs) the problem."""
        if not token.startswith(SERVICE_TOKEN_PREFIX):
            return None
        try:
            return await self.edge.authenticate_service(token, _SCOPE, datetime.now(UTC))
        except ApiError:
            return None

    async def _verify(self, scope: Scope, receive: Receive, send: Send) -> None:
        messages, body = await _read_body(receive)
        headers = _headers(scope)
        parsed = parse_verify_body(body, headers.get("content-type")) if body is not None else None
        service = await self._service(bearer_token(headers.get("authorization", ""))) if parsed is not None else None
        if parsed is None or service is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = _Route(VERIFY_PATH)
        request_id = context_of(scope).request_id
        call = service_call(parsed, service)
        verdict = await self.edge.decide(call, request_id)
        answer = answer_json(verdict, standing_of(self.edge, call, verdict), request_id)
        await _send(send, 200, answer, [(b"content-type", JSON_TYPE)])

    async def _authorize(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        service = await self._service(headers.get("x-tollgate-service-token", ""))
        parsed = self._forwarded(scope, headers) if service is not None else None
        if service is None or parsed is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = _Route(AUTHORIZE_PATH)
        request_id = context_of(scope).request_id
        call = service_call(parsed, service)
        response = self._ingress.answer(await self.edge.decide(call, request_id), request_id)
        await response(scope, receive, send)

    def _forwarded(self, scope: Scope, headers: dict[str, str]) -> VerifyRequest | None:
        """The call the ingress's headers describe, as the route reads them; None: the route's 422."""
        method, uri = forwarded_request(headers)
        client = scope.get("client")
        try:
            peer, hops = client[0] if client else "", forwarded_for(Headers(scope=scope))
            return VerifyRequest.model_validate(self._ingress.described(headers, method, uri, peer, hops))
        except ValidationError:
            return None


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by (lower-case) name, the first of repeated ones (as Starlette's `Headers.get`)."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages as received, and its whole body (None: the client left first)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """`receive` as if nothing had been read: the messages already taken first, in order."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI, edge: Edge) -> None:
    """In front of the app's router (once every route is included), inside its exception handlers."""
    router = app.router
    router.middleware_stack = VerifyFastPath(router.middleware_stack, edge)
