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


# ---- metering ----
from collections.abc import AsyncIterator, Callable  # noqa: E402  (each section stands alone: the lead concatenates)
from dataclasses import dataclass  # noqa: E402
from uuid import UUID  # noqa: E402

from contracts.events import UsageEvent  # noqa: E402
from services.metering.domain import NO_KEY, Cursor, GroupBy  # noqa: E402
from services.metering.rollups import UsageRow, series_key  # noqa: E402
from services.metering.store import ActivityFilter, CallRow, UsageQuery  # noqa: E402


class FakeIngestedIds:
    """The idempotency window (services/metering/ingested.py) as a set."""

    def __init__(self) -> None:
        self.ids: set[UUID] = set()

    async def known(self, ids: list[UUID]) -> set[UUID]:
        return self.ids & set(ids)

    async def remember(self, events: list[UsageEvent]) -> int:
        fresh = {e.id for e in events} - self.ids
        self.ids |= fresh
        return len(fresh)


class FakeUsageTopic:
    """usage.v1 as a list of what was published."""

    def __init__(self) -> None:
        self.published: list[UsageEvent] = []

    async def publish(self, events: list[UsageEvent]) -> None:
        self.published += events


@dataclass(frozen=True)
class _Usage:
    account_id: UUID
    time: datetime
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    api_key_id: UUID

    @property
    def hour(self) -> datetime:
        return self.time.replace(minute=0, second=0, microsecond=0)


def _day(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


class FakeMeteringStore:
    """MeteringStore's reads over rows in memory: ai_tokens events summed per UTC hour or day
    like the rollup, ordered as the builders of domain need; calls newest first with the
    activity log's filters. Streams come in small blocks, so a series may span two of them."""

    BLOCK = 3

    def __init__(self) -> None:
        self.usage: list[_Usage] = []
        self.call_log: list[tuple[UUID, CallRow]] = []

    def add_usage(
        self,
        account_id: UUID,
        time: datetime,
        input_tokens: int,
        output_tokens: int,
        *,
        provider: str = "p",
        model: str = "m",
        api_key_id: UUID | None = None,
    ) -> None:
        self.usage.append(
            _Usage(account_id, time.astimezone(UTC), provider, model, input_tokens, output_tokens, api_key_id or NO_KEY)
        )

    def add_call(self, account_id: UUID, row: CallRow) -> None:
        self.call_log.append((account_id, row))

    # ---- usage ---------------------------------------------------------------------------------
    def _sums(self, events: list[_Usage], bucket: Callable[[datetime], datetime], per_key: bool) -> list[UsageRow]:
        groups: dict[tuple[datetime, str, str, UUID | None], list[_Usage]] = {}
        for e in events:
            groups.setdefault((bucket(e.hour), e.provider, e.model, e.api_key_id if per_key else None), []).append(e)
        return [
            UsageRow(
                start=b,
                provider=p,
                model=m,
                calls=len(es),
                input_tokens=sum(e.input_tokens for e in es),
                output_tokens=sum(e.output_tokens for e in es),
                total_tokens=sum(e.input_tokens + e.output_tokens for e in es),
                api_key_id=k,
                last_time=max(e.time for e in es),
            )
            for (b, p, m, k), es in groups.items()
        ]

    def _of(self, q: UsageQuery) -> list[_Usage]:
        return [
            e
            for e in self.usage
            if e.account_id == q.account_id
            and q.start <= e.hour < q.end
            and (q.api_key_id is None or e.api_key_id == q.api_key_id)
        ]

    async def stream_usage(
        self,
        q: UsageQuery,
        *,
        per: str,
        group_by: GroupBy | None = None,
        keys: list[str] | None = None,
        at_once: bool = False,
    ) -> AsyncIterator[list[UsageRow]]:
        bucket = (lambda h: h) if per == "hour" else _day
        rows = self._sums(self._of(q), bucket, q.per_key or group_by == "api_key")
        if keys:
            rows = sorted(
                (r for r in rows if series_key(r, group_by) in keys),
                key=lambda r: (keys.index(series_key(r, group_by)), r.start),
            )
        elif group_by is not None:
            rows.sort(key=lambda r: (series_key(r, group_by), r.start))
        else:
            rows.sort(key=lambda r: (r.provider, r.model, str(r.api_key_id), r.start))
        if at_once:  # one read, one block (empty too), as the real store does
            yield rows
            return
        for i in range(0, len(rows), self.BLOCK):
            yield rows[i : i + self.BLOCK]

    async def daily_rows_split(self, q: UsageQuery, prev_end: datetime, split: datetime) -> tuple[list[UsageRow], list[UsageRow]]:
        events = [e for e in self._of(q) if e.hour < prev_end or e.hour >= split]
        before = self._sums([e for e in events if e.hour < split], _day, False)
        after = self._sums([e for e in events if e.hour >= split], _day, False)
        return before, after

    # ---- calls ---------------------------------------------------------------------------------
    def _calls(self, account_id: UUID, where: ActivityFilter, after: Cursor | None = None) -> list[CallRow]:
        rows = [
            r
            for a, r in self.call_log
            if a == account_id
            and (where.start is None or r.time >= where.start)
            and (where.end is None or r.time < where.end)
            and (where.api_key_id is None or r.api_key_id == where.api_key_id)
            and (where.ip is None or r.ip == where.ip)
            and (where.status is None or r.status == where.status)
            and (where.refused is None or (r.error_code is not None) == where.refused)
            and (after is None or (r.time, r.id) < (after.time, after.id))
        ]
        return sorted(rows, key=lambda r: (r.time, r.id), reverse=True)

    async def calls(self, account_id: UUID, where: ActivityFilter, limit: int, after: Cursor | None) -> list[CallRow]:
        return self._calls(account_id, where, after)[:limit]

    async def stream_calls(self, account_id: UUID, where: ActivityFilter) -> AsyncIterator[list[CallRow]]:
        rows = self._calls(account_id, where)
        for i in range(0, len(rows), self.BLOCK):
            yield rows[i : i + self.BLOCK]
