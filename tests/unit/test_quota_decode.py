"""(issue 38, decision 4) Quota's consumers of usage.v1 and calls.v1 decode with the msgspec mirrors
first (services/quota/consumers.py: USAGE_READING, CALLS_READING). Differentially, old path against
new, as quota consumes a batch: each record read by the platform's subscriber (decoded, judged by
the topic's rules, or dead-lettered with its reason), then counted by the quota service (on
fakes). Both ways must dead-letter the same records with the same headers, hand the service the
same events with the same values, and leave the same counters, key counters, settled reservations
and published states. Every usage and call fixture of tests/unit/test_fast_events.py (the repo's
producers' forms, the hostile garbage, the lenient and the malformed), the quota tests' own
events, the edge's calls, and a hypothesis run of valid, near-valid and malformed JSON."""

import dataclasses
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaRouter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.common import Resource
from contracts.events import CallEvent, Event, UsageEvent
from contracts.fast_events import FastCall, FastUsage
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import CALLS, USAGE, Topic
from services.edge.calls import Call
from services.quota.consumers import CALLS_READING, COUNTED, USAGE_READING, counter
from services.quota.service import QuotaService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber
from tests.unit import test_fast_events as fast
from tests.unit import test_quota_key_limits as key_limits
from tests.unit import test_quota_service as quota_service
from tests.unit.fakes import FakeClock, FakePublisher, FakeQuotaStore

NOW, STAMP_MS = fast.NOW, fast.STAMP_MS
ACCOUNT, KEY = fast.ACCOUNT, fast.NARROW_KEY  # the key has limits of its own (seeded below)
RESERVATION = uuid.UUID("00000000-0000-4000-8000-00000000003e")  # a live reservation of ACCOUNT
SETTINGS = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s")
TZ = ZoneInfo("Pacific/Kiritimati")  # +14: an event's period is not its UTC month


class DeadLetters:
    """The broker, as dead-lettering uses it: what was published, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, dict[str, str]]] = []

    async def publish(self, value: bytes, topic: str, *, key: bytes | None, headers: dict[str, str]) -> None:
        self.sent.append((topic, value, key, headers))


@dataclasses.dataclass
class Consumed:
    events: list[Any]  # as handed to the service
    dead_letters: list[tuple[str, bytes, bytes | None, dict[str, str]]]
    store: dict[str, Any]  # the fake store's state after the batch
    published: list[tuple[Topic, str, str]]
    counted: float  # what tollgate_quota_events_counted_total gained


async def consume(topic: Topic, reading: Reading[Any], records: Sequence[ConsumerRecord[bytes, bytes]]) -> Consumed:
    """One batch through quota's consumer path: Subscriber.batches' reading of each record, then
    quota's handler (services/runtime/platform/subscribe.py, services/quota/consumers.py)."""
    broker, store, publisher = DeadLetters(), FakeQuotaStore(), FakePublisher()
    service = QuotaService(store, publisher, FakeClock(NOW), TZ, "https://console.test")  # type: ignore[arg-type]
    limits = [KeyLimit(resource=r, amount=50, period=LimitPeriod.DAY) for r in (Resource.AI_TOKENS, Resource.API_CALLS)]
    await service.apply_key(key_limits.key_state(ACCOUNT, KEY, limits))
    await store.add_reservation(RESERVATION, ACCOUNT, Resource.AI_TOKENS, 40, None, NOW, NOW + timedelta(hours=1), KEY, KEY)
    subscriber = Subscriber(KafkaRouter(), broker, SETTINGS)  # type: ignore[arg-type]
    events = [e for r in records if (e := await subscriber._read(topic, reading, r)) is not None]
    metric = COUNTED.labels(topic.name)
    before = metric._value.get()
    await counter(service, topic)(events)
    state = {k: v for k, v in vars(store).items() if k != "transactions"}
    return Consumed(events, broker.sent, state, publisher.sent, metric._value.get() - before)


def values(event: Any, model: type[Event]) -> dict[str, Any]:
    """An event's fields as the service reads them: each value with its type, a time as its
    instant and its offset (the mirror's tzinfo is another class, with the same offset)."""
    out: dict[str, Any] = {}
    for name in model.model_fields:
        value = getattr(event, name)
        out[name] = (value, value.isoformat()) if isinstance(value, datetime) else (value, type(value))
    return out


def published(consumed: Consumed) -> list[tuple[str, str, dict[str, Any]]]:
    """What the service published; a state's id is new at each publication (a crossing's is not)."""
    out = []
    for topic, key, payload in consumed.published:
        body = json.loads(payload)
        if body["type"].endswith("quota_state"):
            del body["id"]
        out.append((topic.name, key, body))
    return out


async def assert_same(model: type[Event], raws: Sequence[bytes], stamps: Sequence[int] | None = None) -> Consumed:
    topic, reading = (USAGE, USAGE_READING) if model is UsageEvent else (CALLS, CALLS_READING)
    records = [fast.record(v, stamps[i] if stamps else STAMP_MS, i) for i, v in enumerate(raws)]
    new = await consume(topic, reading, records)
    old = await consume(topic, dataclasses.replace(reading, first_pass=None), records)  # pydantic alone, as before
    assert all(type(e) is model for e in old.events)
    assert new.dead_letters == old.dead_letters
    assert [values(e, model) for e in new.events] == [values(e, model) for e in old.events]
    assert new.store == old.store
    assert published(new) == published(old)
    assert new.counted == old.counted == len(new.events)
    return new


# ---- every fixture ---------------------------------------------------------------------------------
def quota_usage() -> list[bytes]:
    """The quota tests' own usage events, and ones charging the limited key and settling the reservation."""
    t = NOW - timedelta(hours=3)
    events = [
        quota_service.tokens(ACCOUNT, 50_000, t),
        key_limits.tokens(ACCOUNT, KEY, 30, t),
        key_limits.tokens(ACCOUNT, KEY, 7, t, reservation_id=RESERVATION),
        key_limits.tokens(uuid.uuid4(), KEY, 9, t),  # another tenant's event naming the key
        UsageEvent(time=t, account_id=ACCOUNT, resource=Resource.STORAGE_BYTES, quantity=-5, source="s", api_key_id=KEY),
        UsageEvent(time=NOW - timedelta(days=20), account_id=ACCOUNT, resource=Resource.API_CALLS, quantity=3, source="s"),
    ]
    return [e.model_dump_json().encode() for e in events]


def quota_calls() -> list[bytes]:
    """The quota tests' calls, the edge's own (services/edge/calls.py), the uncounted and refused ones."""
    t = NOW - timedelta(minutes=1)
    edge = Call(t, ACCOUNT, KEY, "POST", "/api/geo/projects", 201, "10.0.0.1", "curl/8", 3.25, service="geo")
    refused = Call(t, ACCOUNT, KEY, "GET", "/api/geo/projects", 429, "10.0.0.1", "", 0.5, "rate_limited", count=40)
    events = [
        quota_service.call(ACCOUNT, t),
        quota_service.call(ACCOUNT, t, status=403),
        quota_service.call(ACCOUNT, t, path="/api/billing/check-quota"),
        key_limits.call(ACCOUNT, KEY, t),
        key_limits.call(ACCOUNT, KEY, t, status=401),
        edge.event(),
        refused.event(),
    ]
    return [e.model_dump_json().encode() for e in events]


TODAY = NOW.date().isoformat()
# every form of a time (test_fast_events.TIMES), on a day the rules accept, so that it is counted
TIMES = [t.replace("2026-11-26", TODAY) for t in fast.TIMES]
TIMES += [f"{TODAY}T11:59:59.{digits}{zone}" for digits in ("9999995", "0000005", "123456789") for zone in ("Z", "+14:00")]
EMOJI = "\U0001f600"


def at_their_edges(sample: dict[str, Any], edges: dict[str, list[Any]]) -> list[bytes]:
    """`sample` with one field at a time set to each of its edge values (or left out: None)."""
    out = []
    for name, values in edges.items():
        for value in values:
            body = {k: v for k, v in sample.items() if k != name} if value is None else {**sample, name: value}
            out.append(json.dumps(body, ensure_ascii=False).encode())
    return out


def texts(limit: int) -> list[Any]:
    return ["x" * limit, "x" * (limit + 1), EMOJI * limit, EMOJI * (limit + 1), "", None]


NUMBERS = [0, 1, -1, 10**12, 10**12 + 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 1.0, "1", True, None]
USAGE_EDGES = {
    "time": TIMES,
    "quantity": NUMBERS,
    "input_tokens": NUMBERS,
    "output_tokens": NUMBERS,
    "source": texts(64),
    "provider": texts(64),
    "model": texts(128),
    "resource": [r.value for r in Resource] + ["AI_TOKENS", None],
    "type": ["usage", "call", None],
}
CALL_EDGES = {
    "time": TIMES,
    "status": [99, 100, 599, 600, 200.0, "200", None],
    "count": [0, 1, 2**31 - 1, 2**31, 1.0, None],
    "latency_ms": [0, -0.0, -0.001, 1e308, 2, "1.5", None],
    "method": texts(16),
    "path": texts(512),
    "ip": texts(64),
    "user_agent": texts(512),
    "error_code": texts(64),
    "service": texts(200),
    "type": ["call", "usage", None],
}


async def test_every_usage_fixture_is_consumed_alike_both_ways():
    raws = fast.usage_fixtures() + quota_usage() + at_their_edges(json.loads(quota_usage()[2]), USAGE_EDGES)
    new = await assert_same(UsageEvent, raws)
    # the fixtures reach every branch: the mirror's events and the model's, dead letters, key
    # counters and a settled reservation
    assert any(isinstance(e, FastUsage) for e in new.events) and any(isinstance(e, UsageEvent) for e in new.events)
    assert new.dead_letters and new.store["key_counters"] and RESERVATION not in new.store["reservations"]


async def test_every_call_fixture_is_consumed_alike_both_ways():
    raws = fast.call_fixtures() + quota_calls() + at_their_edges(json.loads(quota_calls()[5]), CALL_EDGES)
    new = await assert_same(CallEvent, raws)
    assert any(isinstance(e, FastCall) for e in new.events) and any(isinstance(e, CallEvent) for e in new.events)
    assert new.dead_letters and new.store["key_counters"]


async def test_records_judged_by_their_own_timestamps_are_consumed_alike():
    old = key_limits.tokens(ACCOUNT, KEY, 5, NOW - timedelta(days=400)).model_dump_json().encode()
    call = key_limits.call(ACCOUNT, KEY, NOW - timedelta(days=400)).model_dump_json().encode()
    long_ago = STAMP_MS - 400 * 86_400_000
    assert len((await assert_same(UsageEvent, [old, old], [STAMP_MS, long_ago])).dead_letters) == 1
    assert len((await assert_same(CallEvent, [call, call], [STAMP_MS, long_ago])).dead_letters) == 1


async def test_the_producers_own_form_takes_the_first_pass():
    """The point of it: an event as the platform's producers write it never reaches pydantic."""
    usage = await assert_same(UsageEvent, quota_usage())
    calls = await assert_same(CallEvent, quota_calls())
    assert all(isinstance(e, FastUsage) for e in usage.events) and all(isinstance(e, FastCall) for e in calls.events)


# ---- hypothesis: valid, near-valid and malformed ------------------------------------------------------
CHECKS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
USAGE_SAMPLE = json.loads(quota_usage()[2])  # the limited key's, settling the reservation
CALL_SAMPLE = json.loads(quota_calls()[5])  # the edge's


@CHECKS
@given(st.lists(st.tuples(fast._documents(UsageEvent, USAGE_SAMPLE), fast._stamps()), min_size=1, max_size=8))
async def test_generated_usage_batches_are_consumed_alike_both_ways(batch: list[tuple[bytes, int]]):
    await assert_same(UsageEvent, [v for v, _ in batch], [s for _, s in batch])


@CHECKS
@given(st.lists(st.tuples(fast._documents(CallEvent, CALL_SAMPLE), fast._stamps()), min_size=1, max_size=8))
async def test_generated_call_batches_are_consumed_alike_both_ways(batch: list[tuple[bytes, int]]):
    await assert_same(CallEvent, [v for v, _ in batch], [s for _, s in batch])
