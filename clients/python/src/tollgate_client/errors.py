"""Errors the client raises: Tollgate's answer when it refused, or that it could not be reached."""

from typing import Any


class TollgateError(Exception):
    """Tollgate refused a request (its contract's error body), or could not be asked. `headers`
    are the answer's, their names lower-case (`error.headers["retry-after"]`) as HTTP's are
    case-insensitive."""

    def __init__(self, status: int, body: dict[str, Any] | None, headers: dict[str, str] | None = None) -> None:
        error = (body or {}).get("error") or {}
        self.status = status
        self.body = body or {}
        self.headers = {name.lower(): value for name, value in (headers or {}).items()}
        self.code: str = str(error.get("code", "unknown"))
        self.message: str = str(error.get("message", ""))
        self.request_id: str | None = error.get("request_id")
        self.details: Any = error.get("details")
        super().__init__(f"{status} {self.code}: {self.message}")


class InsufficientQuota(TollgateError):
    """403 insufficient_quota: a reservation that does not fit (`details` has used, total, links)."""


class TollgateUnavailable(TollgateError):
    """Tollgate did not answer (or answered 5xx) through every retry: nothing is known to be done.
    Its own 503 (`overloaded`, `service_unavailable`) keeps its body and `Retry-After`."""

    def __init__(self, message: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> None:
        default = {"error": {"code": "service_unavailable", "message": message}}
        super().__init__(503, body or default, {"retry-after": "1", **{k.lower(): v for k, v in (headers or {}).items()}})


def error_of(status: int, body: dict[str, Any] | None, headers: dict[str, str]) -> TollgateError:
    code = str(((body or {}).get("error") or {}).get("code", ""))
    if code == "insufficient_quota":
        return InsufficientQuota(status, body, headers)
    if status >= 500:
        # Tollgate's own 503 is passed on as it is (its code and wait); any other 5xx (a proxy's
        # 502 page, a 500) is a plain "unavailable".
        return TollgateUnavailable(f"{status} {code}".strip(), body if status == 503 and code else None, headers)
    return TollgateError(status, body, headers)
