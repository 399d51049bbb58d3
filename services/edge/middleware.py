"""The one request middleware: request id, the edge's response headers, latency, the call's event.

Pure ASGI (no BaseHTTPMiddleware overhead) and outermost, so every response (even a 413 of the
body limit) has an X-Request-ID. Each request is timed once: the same seconds go to the
Prometheus histogram and to the calls.v1 event of an API-key call.
"""

import secrets
import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.edge.context import CALL_CONTEXT, CallContext
from services.runtime.platform.logs import current_request_id

HTTP_LATENCY = Histogram(
    "tollgate_http_request_seconds",
    "HTTP request latency by method, route template and status (unit: seconds)",
    ["method", "route", "status"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
MAX_REQUEST_ID = 128
MAX_SERIES = 10_000  # (method, route, status) children kept at hand; routes are templates, so few
# The methods a route may take; any other (the HTTP parser accepts some thirty: PROPFIND, MKCOL,
# LINK...) is the caller's choice and is labelled `other`, so no caller adds series at will.
METRIC_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def request_id_from(incoming: str) -> str:
    """A sane incoming X-Request-ID is kept (the caller's tracing), anything else replaced."""
    if 0 < len(incoming) <= MAX_REQUEST_ID and incoming.isascii() and incoming.isprintable():
        return incoming
    return secrets.token_hex(12)


class RequestMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # the histogram's child per label set: `labels()` per request costs more than `observe()`
        self._series: dict[tuple[str, str, int], Histogram] = {}

    def _observe(self, method: str, route: str, status: int, seconds: float) -> None:
        series = self._series.get((method, route, status))
        if series is None:
            if len(self._series) >= MAX_SERIES:
                self._series.clear()
            series = self._series[(method, route, status)] = HTTP_LATENCY.labels(method, route, str(status))
        series.observe(seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_from(next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), ""))
        context = scope[CALL_CONTEXT] = CallContext(request_id, time.perf_counter())
        status = 500  # unless a response starts: what Starlette answers an unhandled error with
        token = current_request_id.set(request_id)

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.setdefault("headers", [])
                headers.append((b"x-request-id", request_id.encode()))
                extra = context.response_headers
                if extra:
                    headers.extend((k.lower().encode(), v.encode()) for k, v in extra.items())
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            seconds = time.perf_counter() - context.started
            current_request_id.reset(token)
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            self._observe(method if method in METRIC_METHODS else "other", route, status, seconds)
            context.finish(status, seconds)  # after the last byte left: e.g. the calls.v1 event
