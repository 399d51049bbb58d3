"""Tollgate for platform services: verify callers' keys, report usage, reserve quota, protect an
ASGI app. See clients/python/README.md."""

from tollgate_client.client import AsyncReservation, AsyncTollgate, Reservation, Tollgate
from tollgate_client.errors import InsufficientQuota, TollgateError, TollgateUnavailable
from tollgate_client.middleware import TollgateMiddleware
from tollgate_client.retry import Retry
from tollgate_client.types import QuotaPosition, RateLimit, ReportResult, UsageEvent, Verdict

__all__ = [
    "AsyncReservation",
    "AsyncTollgate",
    "InsufficientQuota",
    "QuotaPosition",
    "RateLimit",
    "ReportResult",
    "Reservation",
    "Retry",
    "Tollgate",
    "TollgateError",
    "TollgateMiddleware",
    "TollgateUnavailable",
    "UsageEvent",
    "Verdict",
]
