"""Fakes of the ports the use cases take (cosmicpython's fakes): no I/O, so the unit suite runs
every use case in milliseconds. One section per service; the shared ones first."""

from datetime import UTC, datetime, timedelta


class FakeClock:
    """A Clock (contracts/clock.py) that stands still until told to move."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 11, 15, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)
