"""Brute-force protection of `POST /api/auth/login`: failures per e-mail and per client IP.

A sliding log of the last `limit` failure times per subject (bounded memory per subject, and
an LRU bound on the number of subjects). A subject whose `limit`-th most recent failure lies
within `window` seconds is refused with 429 `rate_limited` and an honest `Retry-After`, before
any password is checked, whether or not the password is right (a lock that let the right
password through would tell the attacker when it guessed it).

Every attempt is counted as a failure when it starts and forgiven when it succeeds, so many
guesses sent in parallel cannot slip past the limit before the first of them has failed.
The state is per process: with R replicas the bound is R times the limit (the edge's Redis
store could share it later; a console login is not on any hot path).
"""

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from contracts.domain_errors import DomainError
from contracts.errors import ErrorCode
from services.edge import ApiError
from services.keys.domain import normalize_email

EMAIL_LIMIT = 10  # failures per e-mail within the window
IP_LIMIT = 30  # failures per client IP within the window (one NAT may hold several users)
WINDOW_S = 15 * 60.0
MAX_SUBJECTS = 100_000  # bounded memory under a flood of distinct e-mails


@dataclass(frozen=True)
class Limit:
    failures: int
    window_s: float


class _SlidingLog:
    """subject -> the times of its last `failures` attempts that were not forgiven."""

    def __init__(self, limit: Limit, max_subjects: int) -> None:
        self.limit = limit
        self._max = max_subjects
        self._log: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, subject: str, now: float) -> float:
        """Seconds until `subject` may try again; 0 when it may now."""
        times = self._log.get(subject)
        if times is None or len(times) < self.limit.failures:
            return 0.0
        return max(0.0, times[0] + self.limit.window_s - now)

    def add(self, subject: str, now: float) -> None:
        times = self._log.get(subject)
        if times is None:
            times = self._log[subject] = deque(maxlen=self.limit.failures)
            while len(self._log) > self._max:
                self._log.popitem(last=False)  # the least recently failing subject
        else:
            self._log.move_to_end(subject)
        times.append(now)

    def forgive(self, subject: str, at: float) -> None:
        times = self._log.get(subject)
        if times is not None and at in times:
            times.remove(at)
            if not times:
                del self._log[subject]

    def clear(self, subject: str) -> None:
        self._log.pop(subject, None)


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
        self._emails = _SlidingLog(per_email or Limit(EMAIL_LIMIT, WINDOW_S), max_subjects)
        self._ips = _SlidingLog(per_ip or Limit(IP_LIMIT, WINDOW_S), max_subjects)
        self._clock = clock

    @contextmanager
    def attempt(self, email: str, ip: str) -> Iterator[None]:
        """Wrap one login: 429 if throttled; a wrong password (401 `invalid_credentials`) stays
        counted; success clears the e-mail's failures; any other error is forgiven."""
        subject = normalize_email(email)
        now = self._clock()
        wait = max(self._emails.retry_after(subject, now), self._ips.retry_after(ip, now))
        if wait > 0:
            seconds = max(1, math.ceil(round(wait, 6)))  # round: float noise must not add a second
            raise ApiError(
                429,
                ErrorCode.RATE_LIMITED,
                f"Too many failed logins; retry in {seconds} s.",
                headers={"Retry-After": str(seconds)},
            )
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
