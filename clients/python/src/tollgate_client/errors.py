"""Errors the client raises: Tollgate's answer when it refused, or that it could not be reached."""

from typing import Any


class TollgateError(Exception):
    """Tollgate refused a request (its contract's error body), or could not be asked."""

    def __init__(self, status: int, body: dict[str, Any] | None, headers: dict[str, str] | None = None) -> None:
        error = (body or {}).get("error") or {}
        self.status = status
        self.body = body or {}
        self.headers = headers or {}
        self.code: str = str(error.get("code", "unknown"))
        self.message: str = str(error.get("message", ""))
        self.request_id: str | None = error.get("request_id")
        self.details: Any = error.get("details")
        super().__init__(f"{status} {self.code}: {self.message}")


class InsufficientQuota(TollgateError):
    """403 insufficient_quota: a reservation that does not fit (`details` has used, total, links)."""


class TollgateUnavailable(TollgateError):
    """Tollgate did not answer (or answered 5xx) through every retry: nothing is known to be done."""

    def __init__(self, message: str) -> None:
        super().__init__(503, {"error": {"code": "service_unavailable", "message": message}}, {"Retry-After": "1"})


def error_of(status: int, body: dict[str, Any] | None, headers: dict[str, str]) -> TollgateError:
    code = str(((body or {}).get("error") or {}).get("code", ""))
    if code == "insufficient_quota":
        return InsufficientQuota(status, body, headers)
    if status >= 500:
        return TollgateUnavailable(f"{status} {code}".strip())
    return TollgateError(status, body, headers)
