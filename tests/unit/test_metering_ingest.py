"""Metering's ingest use cases with fakes: POST /api/usage/events' judging, idempotency and
publishing (services/metering/ingest.py `Ingest`), and the sink's batch preparation (`SinkWrite`)."""

import uuid
from datetime import datetime, timedelta

import pytest
from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from contracts.common import Resource
from contracts.domain_errors import Invalid
from contracts.events import CallEvent, UsageEvent
from contracts.metering_api import IngestRequest
from contracts.topics import CALLS, USAGE, Topic
from services.metering.domain import UsageRulesBroken
from services.metering.ingest import Ingest, SinkWrite, call_rules, model_flag, usage_rules
from services.metering.store import Canonical, InsertResult
from tests.unit.fakes import FakeClock, FakeIngestedIds, FakeUsageTopic

ACCOUNT = uuid.uuid4()


def event(
    quantity: int = 30, *, time: datetime | None = None, resource: Resource = Resource.AI_TOKENS, **extra: object
) -> UsageEvent:
    fields: dict[str, object] = {"id": uuid.uuid4(), "provider": "openai", "model": "gpt-4o", "source": "geo-service"} | extra
    return UsageEvent(time=time or FakeClock().now, account_id=ACCOUNT, resource=resource, quantity=quantity, **fields)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ids() -> FakeIngestedIds:
    return FakeIngestedIds()


@pytest.fixture
def topic() -> FakeUsageTopic:
    return FakeUsageTopic()


@pytest.fixture
def ingest(ids: FakeIngestedIds, topic: FakeUsageTopic, clock: FakeClock) -> Ingest:
    return Ingest(ids, topic.publish, clock)


async def refused(ingest: Ingest, events: list[UsageEvent]) -> list[dict[str, object]]:
    with pytest.raises(UsageRulesBroken) as caught:
        await ingest.accept(events)
    assert isinstance(caught.value, Invalid)  # answered 422 validation_error by the edge
    assert caught.value.message == "Some usage events break the contract's rules."
    details: list[dict[str, object]] = caught.value.details
    return details


async def test_a_negative_quantity_on_a_flow_resource_refuses_the_whole_batch(
    ingest: Ingest, topic: FakeUsageTopic, ids: FakeIngestedIds
):
    details = await refused(ingest, [event(), event(-5)])
    assert [(d["field"], d["index"]) for d in details] == [("events.1", 1)]
    assert "negative (-5) on the flow resource ai_tokens" in str(details[0]["message"])
    assert topic.published == [] and ids.ids == set()  # nothing published, nothing remembered


async def test_a_stock_resource_may_go_down(ingest: Ingest, topic: FakeUsageTopic):
    answer = await ingest.accept([event(-5, resource=Resource.GEO_PROJECTS, provider=None, model=None)])
    assert answer.accepted == 1 and len(topic.published) == 1


async def test_tokens_that_disagree_with_the_quantity_are_refused(ingest: Ingest, topic: FakeUsageTopic):
    details = await refused(ingest, [event(30, input_tokens=10, output_tokens=5)])
    assert details == [{"field": "events.0", "index": 0, "message": "quantity: 30 is not input_tokens + output_tokens (10 + 5)"}]
    assert topic.published == []


async def test_a_quantity_above_10_to_the_12_is_refused(ingest: Ingest, topic: FakeUsageTopic):
    details = await refused(ingest, [event(10**12 + 1, resource=Resource.STORAGE_BYTES)])
    assert details == [{"field": "events.0", "index": 0, "message": f"quantity: |{10**12 + 1}| is above 10^12"}]
    assert topic.published == []


async def test_times_too_far_ahead_or_behind_now_are_refused_per_index(ingest: Ingest, topic: FakeUsageTopic, clock: FakeClock):
    now = clock.now
    batch = [
        event(time=now + timedelta(minutes=5)),  # at the edge: fine
        event(time=now + timedelta(minutes=5, seconds=1)),
        event(time=now - timedelta(days=35)),  # fine
        event(time=now - timedelta(days=35, seconds=1)),
        event(-1, time=now + timedelta(hours=1)),  # two rules broken: two details
    ]
    details = await refused(ingest, batch)
    assert [d["index"] for d in details] == [1, 3, 4, 4]
    assert all(d["field"] == f"events.{d['index']}" for d in details)
    assert f"time: more than 5 minutes after {now.isoformat()}" == details[0]["message"]
    assert f"time: more than 35 days before {now.isoformat()}" == details[1]["message"]
    assert topic.published == []


def test_an_event_without_its_id_is_refused_not_given_one():
    """The id is the idempotency key: one invented on parsing would differ at every retry of the
    request, and a retried batch would be counted twice. Refused (422), as the sink dead-letters it."""
    sent = event(7).model_dump(mode="json")
    assert IngestRequest.model_validate({"events": [sent]}).events[0].id == uuid.UUID(sent["id"])
    del sent["id"]
    with pytest.raises(ValidationError) as caught:
        IngestRequest.model_validate({"events": [event().model_dump(mode="json"), sent]})
    assert [(e["loc"], e["type"]) for e in caught.value.errors()] == [(("events", 1, "id"), "missing")]


async def test_the_rules_are_judged_against_the_clock(ingest: Ingest, topic: FakeUsageTopic, clock: FakeClock):
    late = event(time=clock.now + timedelta(minutes=10))
    await refused(ingest, [late])
    clock.advance(minutes=6)
    assert (await ingest.accept([late])).accepted == 1
    assert topic.published == [late]


async def test_a_valid_batch_is_published_as_the_service_sent_it_once_per_id(
    ingest: Ingest, topic: FakeUsageTopic, ids: FakeIngestedIds
):
    first, second = event(10), event(20, input_tokens=5, output_tokens=15, api_key_id=uuid.uuid4())
    answer = await ingest.accept([first, second, first])  # an id repeated within the request
    assert (answer.accepted, answer.duplicates) == (2, 1)
    assert topic.published == [first, second]
    assert [e.source for e in topic.published] == ["geo-service", "geo-service"]  # the reporting service's own
    assert topic.published[1].model_dump() == second.model_dump()  # key, tokens and all, untouched
    assert ids.ids == {first.id, second.id}


async def test_an_id_already_accepted_is_a_duplicate_and_not_published_again(ingest: Ingest, topic: FakeUsageTopic):
    known = event(10)
    await ingest.accept([known])
    fresh = event(20)
    answer = await ingest.accept([known, fresh])
    assert (answer.accepted, answer.duplicates) == (1, 1)
    assert topic.published == [known, fresh]


async def test_an_id_forgotten_after_the_window_is_accepted_again(ingest: Ingest, topic: FakeUsageTopic, ids: FakeIngestedIds):
    again = event(10)
    await ingest.accept([again])
    ids.ids.clear()  # the pruner forgot it
    assert (await ingest.accept([again])).accepted == 1
    assert topic.published == [again, again]  # the sink drops the copy


async def test_an_unacknowledged_publish_remembers_nothing(ids: FakeIngestedIds, clock: FakeClock):
    async def down(events: list[UsageEvent]) -> None:
        raise TimeoutError("no acknowledgement")

    with pytest.raises(TimeoutError):
        await Ingest(ids, down, clock).accept([event()])
    assert ids.ids == set()  # the retry with the same ids is accepted


# ---- the sink's batch ------------------------------------------------------------------------------
def record(value: bytes, timestamp_ms: int, offset: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("usage.v1", 0, offset, timestamp_ms, 0, b"k", value, None, len(value), -1, [])


class FakeSinkPorts:
    def __init__(self) -> None:
        self.dead: list[tuple[str, bytes, str, bytes | None]] = []
        self.written: list[list[bytes]] = []
        self.flagged: list[frozenset[uuid.UUID]] = []

    async def dead_letter(self, topic: Topic, raw: bytes, error: str, key: bytes | None) -> None:
        self.dead.append((topic.name, raw, error, key))

    async def insert(self, lines: list[bytes], canonical: Canonical, flagged: frozenset[uuid.UUID]) -> InsertResult:
        self.written.append([canonical(line) for line in lines])
        self.flagged.append(flagged)
        return InsertResult(len(lines), 0)


async def test_the_sink_dead_letters_what_breaks_the_contract_and_writes_the_rest():
    ports = FakeSinkPorts()
    sink = SinkWrite(USAGE, UsageEvent, ports.insert, ports.dead_letter, usage_rules)
    stamp = int(FakeClock().now.timestamp() * 1000)
    good, negative = event(10).model_dump_json().encode(), event(-3).model_dump_json().encode()
    stale = event(10, time=FakeClock().now - timedelta(days=40)).model_dump_json().encode()
    batch = [record(good, stamp), record(b"{not json", stamp, 1), record(negative, stamp, 2), record(stale, stamp, 3)]
    prepared = await sink.prepare(batch)
    assert prepared.lines == [good] and prepared.dead_lettered == 3
    assert [(t, raw) for t, raw, _, _ in ports.dead] == [("usage.v1", b"{not json"), ("usage.v1", negative), ("usage.v1", stale)]
    assert "negative" in ports.dead[1][2] and all(key == b"k" for *_, key in ports.dead)
    # The same stale event is fine in a backfill whose record is stamped with the event's time.
    assert (await sink.prepare([record(stale, stamp - 40 * 86_400_000)])).lines == [stale]
    assert await sink.write(prepared.lines) == InsertResult(1, 0)
    assert ports.written == [[UsageEvent.model_validate_json(good).model_dump_json().encode()]]


async def test_the_calls_sink_keeps_the_usage_rules_time_window_and_dead_letters_what_breaks_it():
    ports = FakeSinkPorts()
    sink = SinkWrite(CALLS, CallEvent, ports.insert, ports.dead_letter, call_rules)
    now = FakeClock().now
    stamp = int(now.timestamp() * 1000)

    def call(time: datetime) -> bytes:
        return (
            CallEvent(
                time=time,
                account_id=ACCOUNT,
                api_key_id=uuid.uuid4(),
                method="GET",
                path="/api/geo/projects",
                status=200,
                ip="10.0.0.1",
                latency_ms=1.5,
            )
            .model_dump_json()
            .encode()
        )

    fresh, old, ahead = call(now - timedelta(seconds=1)), call(now - timedelta(days=400)), call(now + timedelta(minutes=6))
    prepared = await sink.prepare([record(fresh, stamp), record(old, stamp, 1), record(ahead, stamp, 2)])
    assert prepared.lines == [fresh] and prepared.dead_lettered == 2
    assert [(t, raw) for t, raw, _, _ in ports.dead] == [("calls.v1", old), ("calls.v1", ahead)]
    assert "more than 35 days before" in ports.dead[0][2] and "more than 5 minutes after" in ports.dead[1][2]
    # A backfill of history stamps each record with its call's own time: written.
    assert (await sink.prepare([record(old, stamp - 400 * 86_400_000)])).lines == [old]


async def test_the_sink_flags_usage_of_a_model_its_key_does_not_allow_and_still_writes_it():
    """(v4) Judged against the key's allowed_models as the projection says when the batch is
    written; an allowed model, usage without a key or without a model, a key of no rules: unflagged."""
    ports = FakeSinkPorts()
    narrow, wide, foreign = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    rules = {(ACCOUNT, narrow): ("openai/*",), (ACCOUNT, wide): ()}
    ready_calls: list[int] = []

    async def ready() -> None:
        ready_calls.append(1)

    flag = model_flag(lambda account, key: rules.get((account, key), ()))
    sink = SinkWrite(USAGE, UsageEvent, ports.insert, ports.dead_letter, usage_rules, flag, ready)
    stamp = int(FakeClock().now.timestamp() * 1000)
    denied = event(10, provider="anthropic", model="claude-x", api_key_id=narrow)
    allowed = event(10, provider="openai", model="gpt-4o", api_key_id=narrow)
    bare_name = event(10, provider=None, model="claude-x", api_key_id=narrow)
    no_key = event(10, provider="anthropic", model="claude-x")
    no_model = event(10, provider=None, model=None, api_key_id=narrow, resource=Resource.CONTENT_PUBLISHES)
    unruled = event(10, provider="anthropic", model="claude-x", api_key_id=wide)
    unknown_key = event(10, provider="anthropic", model="claude-x", api_key_id=foreign)
    batch = [denied, allowed, bare_name, no_key, no_model, unruled, unknown_key]
    lines = [e.model_dump_json().encode() for e in batch]
    prepared = await sink.prepare([record(line, stamp, i) for i, line in enumerate(lines)])
    assert prepared.lines == lines and prepared.dead_lettered == 0  # every one is written
    assert prepared.flagged == {denied.id, bare_name.id} and ready_calls == [1]
    await sink.write(prepared.lines, prepared.flagged)
    assert ports.flagged == [{denied.id, bare_name.id}]
