"""Ingest, metering's write side: usage reported over HTTP is judged and published to usage.v1;
the sink writes usage.v1 and calls.v1 to ClickHouse in batches.

Both judge a usage event by the same rules (contracts/usage_rules.py): the endpoint against
now, the sink against the Kafka record's timestamp (every consumer, at any replay, judges a
record the same way); the sink judges a call event's time by the same window. Neither knows
HTTP or Kafka's client: their ports are injected.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast
from uuid import UUID

from contracts.clock import Clock
from contracts.events import Event, UsageEvent
from contracts.fast_events import Decoded, Usage
from contracts.metering_api import IngestResponse
from contracts.topics import Topic
from contracts.usage_rules import time_violations_at, violations, violations_at
from services.metering import domain
from services.metering.domain import UsageRulesBroken
from services.metering.pipeline import Records
from services.metering.store import Canonical, InsertResult
from services.metering.validation import Flag, Rules, judge


class IngestedIds(Protocol):
    """The idempotency window's ids (store.IngestedIds)."""

    async def known(self, ids: list[UUID]) -> set[UUID]: ...

    async def remember(self, events: list[UsageEvent]) -> int: ...


Publish = Callable[[list[UsageEvent]], Awaitable[None]]  # every event acknowledged, or an error


class Ingest:
    """POST /api/usage/events: a platform service reports usage for any account."""

    def __init__(self, ingested: IngestedIds, publish: Publish, clock: Clock) -> None:
        self.ingested = ingested
        self.publish = publish
        self.clock = clock

    async def accept(self, events: Sequence[UsageEvent]) -> IngestResponse:
        """Judge every event, then publish the ones this window has not seen, then remember them
        (a crash between the two re-publishes on retry: the sink drops the duplicates)."""
        reference = self.clock()
        broken: list[dict[str, object]] = [
            {"field": f"events.{i}", "index": i, "message": reason}
            for i, event in enumerate(events)
            for reason in violations(event, reference)
        ]
        if broken:  # the whole batch, or a retry could not tell what was counted
            raise UsageRulesBroken(broken)
        unique = domain.first_of_each_id(list(events))
        known = await self.ingested.known([e.id for e in unique])
        fresh = [e for e in unique if e.id not in known]
        await self.publish(fresh)
        accepted = await self.ingested.remember(fresh)
        return IngestResponse(accepted=accepted, duplicates=len(events) - accepted)


# ---- the sink's batch write ------------------------------------------------------------------------
Insert = Callable[[list[bytes], Canonical, frozenset[UUID]], Awaitable[InsertResult]]  # lines, canonical, flagged ids
DeadLetter = Callable[[Topic, bytes, str, bytes | None], Awaitable[None]]  # topic, raw, error, key
RulesOf = Callable[[Records], Rules]


def usage_rules(records: Records) -> Rules:
    """usage.v1's rules (contracts/usage_rules.py), each event judged against its own record's
    timestamp: every consumer, at any replay, judges a record the same way."""

    def rules(i: int, event: Decoded) -> str | None:
        broken = violations_at(cast(Usage, event), records[i].timestamp * 1000)  # ms -> us; judge parsed a usage event
        return "; ".join(broken) if broken else None

    return rules


def call_rules(records: Records) -> Rules:
    """calls.v1's rule (the usage rules' time window, contracts/usage_rules.py), judged the same way."""

    def rules(i: int, event: Decoded) -> str | None:
        broken = time_violations_at(event, records[i].timestamp * 1000)
        return broken[0] if broken else None

    return rules


AllowedModels = Callable[[UUID, UUID], Sequence[str]]  # (account, key) -> the key's allowed_models (keys.v1)


def model_flag(allowed_models: AllowedModels) -> Flag:
    """(v4) A usage event naming a key and a model that key does not allow is flagged (still
    written and counted: it was served). Judged when the sink writes it, against the key's rules
    as keys.v1 says then, so past usage keeps the judgment of the rules in force when it was
    served (up to the sink's delay), whatever the key allows later."""

    def flag(event: Decoded) -> bool:
        usage = cast(Usage, event)  # judge parsed a usage event
        if usage.api_key_id is None:
            return False
        return domain.model_not_allowed(allowed_models(usage.account_id, usage.api_key_id), usage.provider, usage.model)

    return flag


def canonical(model: type[Event]) -> Canonical:
    return lambda line: model.model_validate_json(line).model_dump_json().encode()


@dataclass(frozen=True, slots=True)
class Prepared:
    lines: list[bytes]  # the JSON documents to write
    dead_lettered: int
    reasons: dict[str, int]  # the dead-lettered, by reason (validation.DEAD_LETTER_REASONS)
    flagged: frozenset[UUID] = frozenset()  # (v4) ids of usage events of a model their key does not allow


class SinkWrite:
    """One topic's batch, validated against its contract model (malformed messages, events
    without an id and events that break the topic's rules go to the dead-letter topic with
    the error, acknowledged before the batch is written), then written as it came from Kafka (the
    engine deduplicates by id). (v4) `flag` marks events stored flagged; `ready` is awaited
    before the first batch is judged (the projection `flag` reads has read its topic to the end)."""

    def __init__(
        self,
        topic: Topic,
        model: type[Event],
        insert: Insert,
        dead_letter: DeadLetter,
        rules_of: RulesOf | None = None,
        flag: Flag | None = None,
        ready: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.topic = topic
        self.model = model
        self.insert = insert
        self.dead_letter = dead_letter
        self.rules_of = rules_of
        self.flag = flag
        self.ready = ready
        self.canonical = canonical(model)

    async def prepare(self, records: Records) -> Prepared:
        if self.ready is not None:
            await self.ready()  # once the keys are known: a key's rules are not judged from an empty projection
        values = [record.value or b"" for record in records]
        verdict = judge(self.model, values, self.rules_of(records) if self.rules_of is not None else None, self.flag)
        if verdict.rejected:
            await asyncio.gather(
                *(self.dead_letter(self.topic, values[i], error, records[i].key) for i, error in verdict.rejected)
            )
        return Prepared(verdict.lines(values), len(verdict.rejected), verdict.reasons, frozenset(verdict.flagged))

    async def write(self, lines: list[bytes], flagged: frozenset[UUID] = frozenset()) -> InsertResult:
        return await self.insert(lines, self.canonical, flagged)
