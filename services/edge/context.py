"""One request's call: what the edge learns about it on the way in, finished once it has been answered.

`RequestMiddleware` (middleware.py) makes a `CallContext` per HTTP request and stores it in the
ASGI scope under `CALL_CONTEXT`; the edge's dependencies fill it (the caller, the rate limiter's
headers, the API-key call's event), the error handlers note the code they answered with, and the
middleware finishes it when the response has been sent (status and latency known). No I/O here.
"""

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from services.edge.calls import Call, CallRecorder
from services.edge.principal import Principal

CALL_CONTEXT = "tollgate.call"  # the scope key of a request's CallContext
REFUSED_STATUSES = frozenset({401, 403, 429})  # a refusal's event carries its error code


@dataclass(slots=True)  # not frozen: filled along the request path (and a frozen __init__ is slower)
class CallContext:
    request_id: str
    started: float  # time.perf_counter() when the request arrived
    # headers the edge decided for this call (e.g. X-RateLimit-*), on success and error alike
    response_headers: dict[str, str] | None = None
    principal: Principal | None = None  # the authenticated customer, once known
    error_code: str | None = None  # the code an ApiError or DomainError was answered with
    # An API-key call's calls.v1 event (status, latency and error code filled at the end) and
    # where it goes; None: no event (not an API-key call).
    call: Call | None = None
    recorder: CallRecorder | None = None
    reserved: bool = False  # admitted: a place in the admitted lane is held for this call
    # Gives back the call's api_calls admission if it ends refused (quota will not count it).
    give_back: Callable[[], None] | None = None

    def hold(self, recorder: CallRecorder, call: Call) -> None:
        """This request is `call` (of an API key); the event is handed to `recorder` at the end.
        A second edge dependency of one route replaces the first one's call, frees its place and
        gives back its admission: one request, one admission."""
        if self.reserved and self.recorder is not None:
            self.recorder.release()
        if self.give_back is not None:
            self.give_back()
        self.reserved, self.give_back = False, None
        self.call, self.recorder = call, recorder

    def finish(self, status: int, seconds: float) -> None:
        """The response has been sent: an admitted call goes to the place reserved for it, a
        refused one (401 of a known key, 403, 429) to its own lane, anything else (e.g. 503
        `overloaded`) nowhere."""
        call, recorder = self.call, self.recorder
        if call is None or recorder is None:
            return
        error_code = self.error_code if status in REFUSED_STATUSES else None
        if not self.reserved and error_code is None:
            return
        call.status = status
        call.latency_ms = round(seconds * 1000, 3)
        call.error_code = error_code
        if self.reserved:
            recorder.record(call)
        else:
            recorder.refuse(call)
        if error_code is not None and self.give_back is not None:
            self.give_back()


def context_of(scope: MutableMapping[str, Any]) -> CallContext:
    """The request's context; made here when no RequestMiddleware runs (e.g. a bare test app),
    where nothing will finish it."""
    context: CallContext | None = scope.get(CALL_CONTEXT)
    if context is None:
        context = scope[CALL_CONTEXT] = CallContext("", perf_counter())
    return context
