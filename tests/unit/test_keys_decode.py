"""(issue 38, decision 4) The keys service's consumer of calls.v1 (each key's last_used_at) decodes
with the msgspec mirror first (services/keys/consumers.py: CALLS_READING). Differentially, old path
against new, as the consumer reads a batch: each record read by the platform's subscriber (decoded,
judged by calls.v1's time rule, or dead-lettered with its reason), then the consumer's handler.
Both ways must dead-letter the same records with the same headers, hand the handler the same
events with the same values, and note the same last-used time (instant and offset) for the same
keys. Every call fixture of tests/unit/test_fast_events.py (the repo's producers' forms, the
hostile garbage, the lenient and the malformed), quota's and the edge's calls, calls of one key out
of order, refused and at one instant in two offsets, and a hypothesis run of valid, near-valid and
malformed JSON."""

import dataclasses
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaRouter
from hypothesis import given
from hypothesis import strategies as st

from contracts.events import CallEvent
from contracts.fast_events import Call, FastCall
from contracts.topics import CALLS
from services.keys.consumers import CALLS_READING, noting_calls
from services.runtime.platform.subscribe import Reading, Subscriber
from tests.unit import test_fast_events as fast
from tests.unit import test_quota_decode as quota_decode

NOW, STAMP_MS, KEY = fast.NOW, fast.STAMP_MS, fast.NARROW_KEY


class NotingService:
    """KeysService as the handler uses it: what each batch noted."""

    def __init__(self) -> None:
        self.noted: list[dict[uuid.UUID, datetime]] = []

    async def note_calls(self, used: dict[uuid.UUID, datetime]) -> None:
        self.noted.append(dict(used))


@dataclasses.dataclass
class Consumed:
    events: list[Call]  # as handed to the handler
    dead_letters: list[tuple[str, bytes, bytes | None, dict[str, str]]]
    noted: list[dict[uuid.UUID, tuple[datetime, str]]]  # each key's last use, with its offset written out


async def consume(reading: Reading[Call], records: Sequence[ConsumerRecord[bytes, bytes]]) -> Consumed:
    """One batch through the keys service's consumer path: Subscriber.batches' reading of each
    record, then the handler (services/runtime/platform/subscribe.py, services/keys/consumers.py)."""
    broker, service = quota_decode.DeadLetters(), NotingService()
    subscriber = Subscriber(KafkaRouter(), broker, quota_decode.SETTINGS)  # type: ignore[arg-type]
    events = [e for r in records if (e := await subscriber._read(CALLS, reading, r)) is not None]
    await noting_calls(service, every_s=0)(events)  # type: ignore[arg-type]
    noted = [{key: (at, at.isoformat()) for key, at in used.items()} for used in service.noted]
    return Consumed(events, broker.sent, noted)


async def assert_same(raws: Sequence[bytes], stamps: Sequence[int] | None = None) -> Consumed:
    records = [fast.record(v, stamps[i] if stamps else STAMP_MS, i) for i, v in enumerate(raws)]
    new = await consume(CALLS_READING, records)
    old = await consume(dataclasses.replace(CALLS_READING, first_pass=None), records)  # pydantic alone, as before
    assert all(type(e) is CallEvent for e in old.events)
    assert new.dead_letters == old.dead_letters
    assert [quota_decode.values(e, CallEvent) for e in new.events] == [quota_decode.values(e, CallEvent) for e in old.events]
    assert new.noted == old.noted
    return new


# ---- every fixture ---------------------------------------------------------------------------------
def one_keys_calls() -> list[bytes]:
    """One key's calls: out of order, refused (error_code: no use), two at one instant in two offsets."""
    t = NOW - timedelta(minutes=5)
    kiritimati = timezone(timedelta(hours=14))
    calls = [
        quota_decode.key_limits.call(fast.ACCOUNT, KEY, t),
        quota_decode.key_limits.call(fast.ACCOUNT, KEY, t - timedelta(minutes=1)),
        quota_decode.key_limits.call(fast.ACCOUNT, KEY, t + timedelta(seconds=30)).model_copy(
            update={"time": (t + timedelta(seconds=30)).astimezone(kiritimati)}
        ),
        quota_decode.key_limits.call(fast.ACCOUNT, KEY, t + timedelta(seconds=30)),
        quota_decode.key_limits.call(fast.ACCOUNT, KEY, t + timedelta(minutes=2)).model_copy(
            update={"error_code": "rate_limited"}
        ),
    ]
    return [c.model_dump_json().encode() for c in calls]


async def test_every_call_fixture_is_consumed_alike_both_ways():
    raws = (
        fast.call_fixtures()
        + quota_decode.quota_calls()
        + one_keys_calls()
        + quota_decode.at_their_edges(json.loads(quota_decode.quota_calls()[5]), quota_decode.CALL_EDGES)
    )
    new = await assert_same(raws)
    # the fixtures reach every branch: the mirror's events and the model's, dead letters, refused calls
    assert any(isinstance(e, FastCall) for e in new.events) and any(isinstance(e, CallEvent) for e in new.events)
    assert new.dead_letters and any(e.error_code for e in new.events)
    (noted,) = new.noted
    assert KEY in noted


async def test_a_keys_last_use_is_its_latest_admitted_call_in_the_offset_first_read_both_ways():
    new = await assert_same(one_keys_calls())
    (noted,) = new.noted
    at, written = noted[KEY]
    assert at == NOW - timedelta(minutes=5) + timedelta(seconds=30) and written.endswith("+14:00")  # the first of two equal


async def test_records_judged_by_their_own_timestamps_are_consumed_alike():
    call = quota_decode.key_limits.call(fast.ACCOUNT, KEY, NOW - timedelta(days=400)).model_dump_json().encode()
    assert len((await assert_same([call, call], [STAMP_MS, STAMP_MS - 400 * 86_400_000])).dead_letters) == 1


async def test_the_producers_own_form_takes_the_first_pass():
    """The point of it: a call as the edge writes it never reaches pydantic."""
    new = await assert_same(quota_decode.quota_calls() + one_keys_calls())
    assert all(isinstance(e, FastCall) for e in new.events)


# ---- hypothesis: valid, near-valid and malformed ------------------------------------------------------
@quota_decode.CHECKS
@given(
    st.lists(
        st.tuples(fast._documents(CallEvent, quota_decode.CALL_SAMPLE), fast._stamps()),  # one key's calls, mostly
        min_size=1,
        max_size=8,
    )
)
async def test_generated_call_batches_are_consumed_alike_both_ways(batch: list[tuple[bytes, int]]):
    await assert_same([v for v, _ in batch], [s for _, s in batch])
