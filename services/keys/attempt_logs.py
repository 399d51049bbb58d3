"""Where the throttles' attempt logs live (login_throttle.py, registration_throttle.py): the port,
and this process's logs (`LocalLogs`). Redis shares them between replicas (redis_logs.py), with
this process's logs as the fallback while Redis does not answer (failover_logs.py).

One `count` judges an attempt against every log it is counted in and, when none is full, counts
it in each, in one step (an await, but nothing between the judgment and the counting), so
attempts sent in parallel cannot slip past a limit.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.keys.throttle import MAX_SUBJECTS, Limit, SlidingLog


@dataclass(frozen=True)
class Log:
    """One throttled log: its name (a part of its Redis keys) and its limit."""

    name: str
    limit: Limit


Entry = tuple[Log, str]  # a log and one of its subjects (an e-mail, a client address)


@dataclass(frozen=True)
class Counted:
    """An attempt's judgment: refused for `wait` seconds (> 0, nothing counted), or counted in
    each of its logs under `stamp` (what `forgive` takes back); `shared`: counted in Redis."""

    wait: float = 0.0
    stamp: str = ""
    shared: bool = False


class AttemptLogs(Protocol):
    async def count(self, entries: Sequence[Entry]) -> Counted:
        """Refused with the longest wait of the full logs, else counted in all of them."""
        ...

    async def forgive(self, entries: Sequence[Entry], counted: Counted) -> None:
        """Take back an attempt `count` counted."""
        ...

    async def clear(self, entries: Sequence[Entry]) -> None:
        """Forget every attempt of these subjects."""
        ...

    async def close(self) -> None: ...


class LocalLogs:
    """This process's logs: a SlidingLog per Log, on this process's monotonic clock."""

    def __init__(self, max_subjects: int = MAX_SUBJECTS, clock: Callable[[], float] = time.monotonic) -> None:
        self._logs: dict[Log, SlidingLog] = {}
        self._max = max_subjects
        self._clock = clock

    def _log(self, log: Log) -> SlidingLog:
        found = self._logs.get(log)
        if found is None:
            found = self._logs[log] = SlidingLog(log.limit, self._max)
        return found

    async def count(self, entries: Sequence[Entry]) -> Counted:
        now = self._clock()
        wait = max((self._log(log).retry_after(subject, now) for log, subject in entries), default=0.0)
        if wait > 0:
            return Counted(wait)
        for log, subject in entries:
            self._log(log).add(subject, now)
        return Counted(stamp=repr(now))

    async def forgive(self, entries: Sequence[Entry], counted: Counted) -> None:
        for log, subject in entries:
            self._log(log).forgive(subject, float(counted.stamp))

    async def clear(self, entries: Sequence[Entry]) -> None:
        for log, subject in entries:
            self._log(log).clear(subject)

    def subjects(self, log: Log) -> int:
        """How many subjects `log` holds (its memory is bounded by max_subjects)."""
        return len(self._log(log))

    async def close(self) -> None:
        return None
