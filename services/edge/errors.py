"""The contract's error body for every status >= 400, and the X-Request-ID on every response."""

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.domain_errors import (
    Conflict,
    DomainError,
    Forbidden,
    Invalid,
    NotFound,
    PaymentRequired,
    Unauthenticated,
)
from contracts.errors import ErrorBody, ErrorCode, ErrorDetail

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
# Request-state slots the edge fills on the request path and RequestIdMiddleware honours.
RESPONSE_HEADERS = "edge_response_headers"  # dict[str, str] added to the response, errors included
RESPONSE_DONE = "edge_response_done"  # ResponseDone called with (status, seconds, code) once it is sent
ERROR_CODE = "edge_error_code"  # the code of a refusal (401, 403, 429) answered with ApiError
REFUSED_STATUSES = frozenset({401, 403, 429})
ResponseDone = Callable[[int, float, str | None], None]
_STATUS_CODES = {
    401: ErrorCode.MISSING_CREDENTIALS,
    403: ErrorCode.PERMISSION_DENIED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    422: ErrorCode.VALIDATION_ERROR,
    429: ErrorCode.RATE_LIMITED,
    503: ErrorCode.SERVICE_UNAVAILABLE,
}


# The one place a domain error becomes an HTTP status (most specific base first).
DOMAIN_STATUSES: tuple[tuple[type[DomainError], int], ...] = (
    (Unauthenticated, 401),
    (PaymentRequired, 402),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (Invalid, 422),
)


def status_of(error: DomainError) -> int:
    return next((status for base, status in DOMAIN_STATUSES if isinstance(error, base)), 422)


class ApiError(Exception):
    """Raise anywhere below a route: becomes the contract's error body with this status."""

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        *,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}


def not_found(what: str = "resource") -> ApiError:
    return ApiError(404, ErrorCode.NOT_FOUND, f"The {what} does not exist.")


def request_id_of(request: Request) -> str:
    return str(getattr(request.state, "request_id", "") or "")


def error_response(
    request: Request, status: int, code: ErrorCode, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, request_id=request_id_of(request), details=details))
    return JSONResponse(body.model_dump(mode="json", exclude_none=True), status_code=status, headers=headers)


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {
            "field": ".".join(str(p) for p in err.get("loc", ()) if p != "body"),
            "message": err.get("msg", ""),
            "type": err.get("type", ""),
        }
        for err in exc.errors()
    ]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        if exc.status in REFUSED_STATUSES:  # a refused call: its calls.v1 event carries the code
            request.scope.setdefault("state", {})[ERROR_CODE] = exc.code.value
        return error_response(request, exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(DomainError)
    async def _domain_error(request: Request, exc: DomainError) -> JSONResponse:
        status = status_of(exc)
        if status in REFUSED_STATUSES:
            request.scope.setdefault("state", {})[ERROR_CODE] = exc.code.value
        return error_response(request, status, exc.code, exc.message, exc.details)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, 422, ErrorCode.VALIDATION_ERROR, "The request is not valid.", _validation_details(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode at all (e.g. not UTF-8); a bad body is a
            # 422 `validation_error` in the contract.
            return error_response(request, 422, ErrorCode.VALIDATION_ERROR, "The request body could not be read as JSON.")
        code = _STATUS_CODES.get(
            exc.status_code, ErrorCode.VALIDATION_ERROR if exc.status_code < 500 else ErrorCode.INTERNAL_ERROR
        )
        return error_response(request, exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"request_id": request_id_of(request)})
        # Starlette answers this one from its outermost middleware, outside RequestIdMiddleware: set the id here.
        return error_response(
            request,
            500,
            ErrorCode.INTERNAL_ERROR,
            "Something went wrong on our side.",
            headers={REQUEST_ID_HEADER: request_id_of(request)},
        )


class RequestIdMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware overhead): accepts a sane incoming id or makes one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = (
            incoming if 0 < len(incoming) <= 128 and incoming.isascii() and incoming.isprintable() else secrets.token_hex(12)
        )
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.setdefault("headers", [])
                headers.append((b"x-request-id", request_id.encode()))
                # e.g. X-RateLimit-* that the edge decided for this call, on success and error alike
                extra: dict[str, str] | None = state.get(RESPONSE_HEADERS)
                if extra:
                    headers.extend((k.lower().encode(), v.encode()) for k, v in extra.items())
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            done: ResponseDone | None = state.get(RESPONSE_DONE)
            if done is not None:  # after the last byte left: e.g. the edge's calls.v1 event
                done(status, time.perf_counter() - started, state.get(ERROR_CODE) if status in REFUSED_STATUSES else None)
