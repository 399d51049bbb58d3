"""Brute-force protection of `POST /api/auth/login`: failures per e-mail and per client IP.

A sliding log of the last `limit` failure times per subject (services/keys/throttle.py). A
subject whose `limit`-th most recent failure lies within `window` seconds is refused with 429
`rate_limited` and an honest `Retry-After`, before any password is checked, whether or not the
password is right (a lock that let the right password through would tell the attacker when it
guessed it).

Every attempt is counted as a failure when it starts and forgiven when it succeeds, so many
guesses sent in parallel cannot slip past the limit before the first of them has failed.
The state is per process (services/keys/throttle.py).
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from contracts.domain_errors import DomainError
from contracts.errors import ErrorCode
from services.edge import ApiError
from services.keys.domain import normalize_email
from services.keys.throttle import MAX_SUBJECTS, Limit, SlidingLog, client_subject, refuse_if_waiting

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
        max_subjects: int = MAX_SUBJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The module's limits are read here, not at import, so a test can lower them for one app.
        self._emails = SlidingLog(per_email or Limit(EMAIL_LIMIT, WINDOW_S), max_subjects)
        self._ips = SlidingLog(per_ip or Limit(IP_LIMIT, WINDOW_S), max_subjects)
        self._clock = clock

    @contextmanager
    def attempt(self, email: str, ip: str) -> Iterator[None]:
        """Wrap one login: 429 if throttled; a wrong password (401 `invalid_credentials`) stays
        counted; success clears the e-mail's failures; any other error is forgiven."""
        subject, ip = normalize_email(email), client_subject(ip)  # an IPv6 client by its /64
        now = self._clock()
        refuse_if_waiting(max(self._emails.retry_after(subject, now), self._ips.retry_after(ip, now)), "failed logins")
        self._emails.add(subject, now)
        self._ips.add(ip, now)
        try:
            yield
        except (ApiError, DomainError) as exc:
            if exc.code != ErrorCode.INVALID_CREDENTIALS:
                self._forgive(subject, ip, now)
            raise
        except BaseException:
            self._forgive(subject, ip, now)
            raise
        self._emails.clear(subject)
        self._ips.forgive(ip, now)

    def _forgive(self, subject: str, ip: str, at: float) -> None:
        self._emails.forgive(subject, at)
        self._ips.forgive(ip, at)
