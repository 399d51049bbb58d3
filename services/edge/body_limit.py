"""Bounded request bodies: 413 payload_too_large with the contract's body, chunked or not."""

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.errors import ErrorCode
from services.edge.context import CALL_CONTEXT, CallContext

MAX_BODY_BYTES = 2 * 1024 * 1024  # 1,000 usage events fit with room to spare
_FRAMED_BY_HEADERS = frozenset({"1.0", "1.1"})  # (HTTP/2 frames a body without either header)


class _TooLarge(HTTPException):
    """An HTTPException so that FastAPI's body parsing re-raises it instead of answering 400
    "error parsing the body"; the error handler turns a 413 into payload_too_large."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"The request body is larger than {max_bytes} bytes.")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = chunked = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value if declared is None else declared
            elif name == b"transfer-encoding":
                chunked = value
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._reject(scope, send)
            return
        if declared is None and chunked is None and scope.get("http_version") in _FRAMED_BY_HEADERS:
            # Neither header: an HTTP/1.x request without a body (RFC 9112, 6.3), nothing to count.
            # (The hot GETs, whose receive and send need no wrapping.)
            await self.app(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge:
            if not started:
                await self._reject(scope, send)

    async def _reject(self, scope: Scope, send: Send) -> None:
        context: CallContext | None = scope.get(CALL_CONTEXT)
        request_id = context.request_id if context is not None else ""
        body = json.dumps(
            {
                "error": {
                    "code": ErrorCode.PAYLOAD_TOO_LARGE.value,
                    "message": f"The request body is larger than {self.max_bytes} bytes.",
                    "request_id": request_id,
                }
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
