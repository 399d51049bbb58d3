"""Flood protection of `POST /api/auth/register`: sign-ups per client IP.

Every sign-up that reaches the handler costs an argon2 hash (argon2-cffi's defaults: 3 passes over
64 MiB, ~0.4 s of a core), whether it succeeds or finds the e-mail taken, so every one counts and
none is forgiven. A client address may make `REGISTRATIONS_PER_IP` sign-ups per `WINDOW_S` (a
signup page, even one behind a busy NAT, makes a few an hour; a flood makes hundreds a minute);
the next is refused with 429 `rate_limited` and `Retry-After` before any hashing.

The limit is of argon2 work, counted in sign-ups at the production parameters: a hasher set to
1/k of their cost (passes x memory) gets k times the sign-ups, because what the throttle guards is
the CPU and memory that work takes. So the test platforms, which hash at argon2's cheapest
parameters (tests/support/cheap_hashes.py), register as many accounts as they like from one
address, with no setting and no bypass; a platform at the production parameters meets the limit.
Shared by the replicas through Redis when REDIS_URL is set, like login's (services/keys/throttle.py).
"""

import time
from collections.abc import Callable

from argon2 import PasswordHasher

from services.keys.attempt_logs import AttemptLogs, LocalLogs, Log
from services.keys.throttle import MAX_SUBJECTS, Limit, client_subject, refuse_if_waiting

REGISTRATIONS_PER_IP = 20  # sign-ups per client IP within the window, at the production argon2 cost
WINDOW_S = 10 * 60.0


def hash_cost(hasher: PasswordHasher) -> int:
    """argon2's work for one hash: passes x KiB of memory (its time and its memory both scale with it)."""
    return hasher.time_cost * hasher.memory_cost


def limit_for(hasher: PasswordHasher) -> Limit:
    """`REGISTRATIONS_PER_IP` production sign-ups' worth of `hasher`'s hashes per window."""
    # Read at the call, not at import, so a test can lower it for one app.
    production = hash_cost(PasswordHasher())
    return Limit(max(1, REGISTRATIONS_PER_IP * production // hash_cost(hasher)), WINDOW_S)


class RegistrationThrottle:
    def __init__(
        self,
        per_ip: Limit,
        *,
        logs: AttemptLogs | None = None,
        max_subjects: int = MAX_SUBJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`logs` as LoginThrottle's: by default this process's."""
        self._ips = Log("signup-ip", per_ip)
        self.logs = logs if logs is not None else LocalLogs(max_subjects, clock)

    async def admit(self, ip: str) -> None:
        """Count one sign-up from `ip` (an IPv6 one by its /64: throttle.client_subject), or refuse it
        (429 with `Retry-After`) when its window is full."""
        counted = await self.logs.count(((self._ips, client_subject(ip)),))
        refuse_if_waiting(counted.wait, "sign-ups from this address")
