"""The bases of every service's domain errors.

Use cases raise these (or subclasses); they know nothing of HTTP. `services/edge/errors.py` maps
each base to its status once, with the contract's error body: the code, the message and the
details given here.
"""

from typing import Any, ClassVar

from contracts.errors import ErrorCode


class DomainError(Exception):
    default_code: ClassVar[ErrorCode] = ErrorCode.VALIDATION_ERROR

    def __init__(self, message: str, *, code: ErrorCode | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details = details


class Unauthenticated(DomainError):
    """401: the caller is not who it claims (a wrong password, an unknown credential)."""

    default_code = ErrorCode.INVALID_CREDENTIALS


class PaymentRequired(DomainError):
    """402: the change needs an order paid first."""

    default_code = ErrorCode.PAYMENT_REQUIRED


class Forbidden(DomainError):
    """403: known caller, not allowed (a role, an exhausted quota, a console-only action)."""

    default_code = ErrorCode.PERMISSION_DENIED


class NotFound(DomainError):
    """404: absent, or another account's (never told apart)."""

    default_code = ErrorCode.NOT_FOUND

    def __init__(self, what: str = "resource", *, code: ErrorCode | None = None, details: Any = None) -> None:
        super().__init__(f"The {what} does not exist.", code=code, details=details)


class Conflict(DomainError):
    """409: a unique value already taken, or a state that forbids the change."""

    default_code = ErrorCode.CONFLICT


class Invalid(DomainError):
    """422: the request is well-formed but breaks a rule."""

    default_code = ErrorCode.VALIDATION_ERROR
