"""When to try a request again, and how long to wait: exponential backoff with jitter, and
`Retry-After` when Tollgate names the wait.

A request is retried after a lost answer (a timeout, a dropped connection, a proxy's 502/504)
only when repeating it cannot count twice: a usage report (Tollgate counts each event id once)
and a release. A verify is a metered call and a reservation a new hold, so those are repeated
only when Tollgate certainly did nothing: the connection was never made, or it answered 503
(overloaded, a dependency down) or 429."""

import random
from dataclasses import dataclass

import httpx

NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
NOTHING_DONE = frozenset({429, 503})
MAYBE_DONE = frozenset({502, 504})


@dataclass(frozen=True)
class Retry:
    attempts: int = 5  # in all, the first included
    initial: float = 0.1  # seconds before the second attempt (then doubling)
    maximum: float = 5.0  # the longest wait between two attempts

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """The wait after failed attempt number `attempt` (0-based)."""
        named = response.headers.get("retry-after") if response is not None else None
        if named is not None and named.isdigit():
            return min(float(named), self.maximum)
        ceiling = min(self.maximum, self.initial * 2**attempt)
        return random.uniform(ceiling / 2, ceiling)


def retryable_error(error: httpx.TransportError, idempotent: bool) -> bool:
    return idempotent or isinstance(error, NOT_SENT)


def retryable_status(status: int, idempotent: bool) -> bool:
    return status in NOTHING_DONE or (idempotent and status in MAYBE_DONE)
