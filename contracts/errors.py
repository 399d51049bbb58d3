"""The error body every service returns for status >= 400, and the fixed codes of API.md."""

from enum import StrEnum
from typing import Any

from pydantic import BaseModel


class ErrorCode(StrEnum):
    MISSING_CREDENTIALS = "missing_credentials"
    INVALID_API_KEY = "invalid_api_key"
    API_KEY_DISABLED = "api_key_disabled"
    API_KEY_EXPIRED = "api_key_expired"
    INVALID_SESSION = "invalid_session"
    CONSOLE_SESSION_REQUIRED = "console_session_required"
    PERMISSION_DENIED = "permission_denied"
    INSUFFICIENT_QUOTA = "insufficient_quota"
    NOT_FOUND = "not_found"
    USER_TYPE_PLAN_MISMATCH = "user_type_plan_mismatch"
    VALIDATION_ERROR = "validation_error"
    RATE_LIMITED = "rate_limited"
    PAYMENT_REQUIRED = "payment_required"
    # v2
    INVALID_SERVICE_TOKEN = "invalid_service_token"  # noqa: S105 - an error code, not a secret
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    LAST_OWNER = "last_owner"
    OVERLOADED = "overloaded"
    # v4: a key's own restrictions (contracts/key_limits.py)
    IP_NOT_ALLOWED = "ip_not_allowed"
    ROUTE_NOT_ALLOWED = "route_not_allowed"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    # Not in API.md's table; used where the contract is silent.
    CONFLICT = "conflict"
    INVALID_CREDENTIALS = "invalid_credentials"  # login with a wrong e-mail or password
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    SERVICE_UNAVAILABLE = "service_unavailable"
    INTERNAL_ERROR = "internal_error"


class ErrorDetail(BaseModel):
    code: ErrorCode
    message: str
    request_id: str
    details: Any | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
