"""The contract's error body for every status >= 400 (its request id from the CallContext)."""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

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
from services.edge.context import CALL_CONTEXT, CallContext, context_of

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
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


_ERROR_STATUSES = {
    401: "Missing, invalid, disabled or expired credentials",
    403: "Not allowed: console session required, permission denied, or quota exhausted",
    404: "Not found (also another account's objects)",
    409: "Conflicts with the current state",
    422: "The body or query is not valid; `details` lists the fields",
    429: "Rate-limited; see Retry-After",
    503: "A dependency is unavailable, or (`overloaded`) the edge cannot meter more calls; retry after Retry-After",
}
# Every error a route can answer uses the contract's body; documented on every operation.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _ERROR_STATUSES.items()
}


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
    context: CallContext | None = request.scope.get(CALL_CONTEXT)
    return context.request_id if context is not None else ""


def error_response(
    request: Request, status: int, code: ErrorCode, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> Response:
    return _contract_error(status, code, message, request_id_of(request), details, headers)


def api_error_response(scope: Scope, exc: ApiError) -> Response:
    """An ApiError's answer; its code goes to the call's event (a refusal's calls.v1 carries it)."""
    context = context_of(scope)
    context.error_code = exc.code.value
    return _contract_error(exc.status, exc.code, exc.message, context.request_id, exc.details, exc.headers)


def _contract_error(
    status: int, code: ErrorCode, message: str, request_id: str, details: Any, headers: dict[str, str] | None
) -> Response:
    """The contract's body, serialised by pydantic straight to JSON bytes (one pass, not a dict
    that JSONResponse dumps again: refusals are the cheap path a flood takes)."""
    body = ErrorBody(error=ErrorDetail(code=code, message=message, request_id=request_id, details=details))
    return Response(body.model_dump_json(exclude_none=True), status_code=status, headers=headers, media_type="application/json")


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
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return api_error_response(request.scope, exc)

    @app.exception_handler(DomainError)
    async def _domain_error(request: Request, exc: DomainError) -> Response:
        context_of(request.scope).error_code = exc.code.value
        return error_response(request, status_of(exc), exc.code, exc.message, exc.details)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return error_response(request, 422, ErrorCode.VALIDATION_ERROR, "The request is not valid.", _validation_details(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode at all (e.g. not UTF-8); a bad body is a
            # 422 `validation_error` in the contract.
            return error_response(request, 422, ErrorCode.VALIDATION_ERROR, "The request body could not be read as JSON.")
        code = _STATUS_CODES.get(
            exc.status_code, ErrorCode.VALIDATION_ERROR if exc.status_code < 500 else ErrorCode.INTERNAL_ERROR
        )
        return error_response(request, exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", extra={"request_id": request_id_of(request)})
        # Starlette answers this one from its outermost middleware, outside RequestMiddleware: set the id here.
        return error_response(
            request,
            500,
            ErrorCode.INTERNAL_ERROR,
            "Something went wrong on our side.",
            headers={REQUEST_ID_HEADER: request_id_of(request)},
        )
