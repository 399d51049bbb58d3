"""Brute-force protection of `POST /api/auth/login`: failures per e-mail and per client IP.

A sliding log of the last `limit` failure times per subject (services/keys/throttle.py). A
subject whose `limit`-th most recent failure lies within `window` seconds is refused with 429
`rate_limited` and an honest `Retry-After`, before any password is checked, whether or not the
password is right (a lock that let the right password through would tell the attacker when it
guessed it).

Every attempt is counted as a failure when it starts and forgiven when it succeeds, so many
guesses sent in parallel (to one replica or to several) cannot slip past the limit before the
first of them has failed. With REDIS_URL set the replicas share the logs through Redis
(services/keys/redis_logs.py), so R replicas together allow the limit once; without it, or while
Redis does not answer, each process counts alone (services/keys/failover_logs.py).
"""

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from contracts.domain_errors import DomainError
from contracts.errors import ErrorCode
from services.edge import ApiError
from services.keys.attempt_logs import AttemptLogs, LocalLogs, Log
from services.keys.domain import normalize_email
from services.keys.throttle import MAX_SUBJECTS, Limit, client_subject, refuse_if_waiting

__all__ = ["EMAIL_LIMIT", "IP_LIMIT", "WINDOW_S", "Limit", "LoginThrottle"]

EMAIL_LIMIT = 10  # failures per e-mail within the window
IP_LIMIT = 30  # failures per client IP within the window (one NAT may hold several users)
WINDOW_S = 15 * 60.0


class LoginThrottle:
    def __init__(
        self,
        per_email: Limit | None = None,
        per_ip: Limit | None = None,
        *,
        logs: AttemptLogs | None = None,
        max_subjects: int = MAX_SUBJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`logs`: where the failures are kept (failover_logs.attempt_logs: shared by the replicas
        through Redis); by default this process's, `max_subjects` per log on `clock`."""
        # The module's limits are read here, not at import, so a test can lower them for one app.
        self._emails = Log("login-email", per_email or Limit(EMAIL_LIMIT, WINDOW_S))
        self._ips = Log("login-ip", per_ip or Limit(IP_LIMIT, WINDOW_S))
        self.logs = logs if logs is not None else LocalLogs(max_subjects, clock)

    @asynccontextmanager
    async def attempt(self, email: str, ip: str) -> AsyncIterator[None]:
        """Wrap one login: 429 if throttled; a wrong password (401 `invalid_credentials`) stays
        counted; success clears the e-mail's failures; any other error is forgiven."""
        # an IPv6 client by its /64
        email_entry, ip_entry = (self._emails, normalize_email(email)), (self._ips, client_subject(ip))
        counted = await self.logs.count((email_entry, ip_entry))
        refuse_if_waiting(counted.wait, "failed logins")
        try:
            yield
        except (ApiError, DomainError) as exc:
            if exc.code != ErrorCode.INVALID_CREDENTIALS:
                await self.logs.forgive((email_entry, ip_entry), counted)
            raise
        except BaseException:
            await self.logs.forgive((email_entry, ip_entry), counted)
            raise
        await self.logs.clear((email_entry,))
        await self.logs.forgive((ip_entry,), counted)
