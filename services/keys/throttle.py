"""The keys service's per-subject throttle: a sliding log of each subject's last attempts and the
contract's 429. Login (services/keys/login_throttle.py) and sign-up
(services/keys/registration_throttle.py) each keep their own logs with their own limits.

A subject's log holds the times of its last `limit.attempts` counted attempts (bounded memory per
subject, and an LRU bound on the number of subjects); when the oldest of them lies within
`window_s` the subject is refused until it leaves. `SlidingLog` is this process's copy of that
rule; with REDIS_URL set every replica shares the logs in Redis instead (redis_logs.py, the same
rule in Lua), so R replicas together allow the limit once, not R times; this process's logs stay
the store without Redis and the fallback while Redis does not answer (failover_logs.py).
"""

import ipaddress
import math
from collections import OrderedDict
from dataclasses import dataclass

from contracts.errors import ErrorCode
from services.edge import ApiError

MAX_SUBJECTS = 100_000  # bounded memory under a flood of distinct e-mails or addresses
# An IPv6 client is counted by its network of this length: a host picks any of its /64's 2^64
# addresses at will (privacy addresses, or one per attempt), so counting each address alone would
# never meet a limit. A /64 is one subscriber's LAN at most (RFC 6177 gives a site a /56 or more).
IPV6_CLIENT_PREFIX = 64


def client_subject(ip: str) -> str:
    """What a client address is counted under: an IPv4 address itself (an IPv4-mapped IPv6 one as
    its plain IPv4 form, as a dual-stack listener reports it); an IPv6 one by its /64. Anything
    else (no address: a test client's name) as it is."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)


@dataclass(frozen=True)
class Limit:
    attempts: int
    window_s: float


class SlidingLog:
    """subject -> the times of its last `limit.attempts` attempts that were not forgiven."""

    def __init__(self, limit: Limit, max_subjects: int = MAX_SUBJECTS) -> None:
        self.limit = limit
        self._max = max_subjects
        # A list, not a deque(maxlen=...): a deque allocates a 64-slot block per subject, ~0.9 KB,
        # which made the log ~94 MB at MAX_SUBJECTS; a list of one time is ~0.1 KB.
        self._log: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._log)

    def retry_after(self, subject: str, now: float) -> float:
        """Seconds until `subject` may try again; 0 when it may now."""
        times = self._log.get(subject)
        if times is None or len(times) < self.limit.attempts:
            return 0.0
        return max(0.0, times[0] + self.limit.window_s - now)

    def add(self, subject: str, now: float) -> None:
        times = self._log.get(subject)
        if times is None:
            self._log[subject] = [now]
            while len(self._log) > self._max:
                self._log.popitem(last=False)  # the least recently counted subject
            return
        self._log.move_to_end(subject)
        times.append(now)
        if len(times) > self.limit.attempts:
            del times[0]  # only the last `attempts` times decide

    def forgive(self, subject: str, at: float) -> None:
        times = self._log.get(subject)
        if times is not None and at in times:
            times.remove(at)
            if not times:
                del self._log[subject]

    def clear(self, subject: str) -> None:
        self._log.pop(subject, None)


def refuse_if_waiting(wait: float, what: str) -> None:
    """429 `rate_limited` with an honest `Retry-After` (whole seconds, at least 1) while `wait` > 0."""
    if wait > 0:
        seconds = max(1, math.ceil(round(wait, 6)))  # round: float noise must not add a second
        raise ApiError(
            429,
            ErrorCode.RATE_LIMITED,
            f"Too many {what}; retry in {seconds} s.",
            headers={"Retry-After": str(seconds)},
        )
