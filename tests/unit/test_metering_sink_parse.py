"""The sink's batch parse: every raw message validated once; malformed ones come back with
their error (for the dead-letter topic) and never stop the valid ones around them. What goes on
to the engine is the message as it came when it is in the contract's strict form, else the
model's own serialisation (so the engine never reads a form it could read differently)."""

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from aiokafka import TopicPartition

from contracts.common import Resource
from contracts.events import MISSING_ID, UsageEvent
from services.metering.pipeline import Batch
from services.metering.validation import Verdict, judge


@dataclass
class Record:
    value: bytes | None
    topic: str = "usage.v1"
    partition: int = 0
    offset: int = 0


def split_valid(values: list[bytes]) -> tuple[list[bytes], list[tuple[int, str]]]:
    """What the sink writes of a batch, and the (index, error) of what it dead-letters."""
    verdict = judge(UsageEvent, values)
    return verdict.lines(values), verdict.rejected


def event(n: int) -> UsageEvent:
    return UsageEvent(
        time=datetime(2026, 11, 1, tzinfo=UTC), account_id=uuid.uuid4(), resource=Resource.AI_TOKENS, quantity=n, source="t"
    )


def test_valid_events_keep_their_order_and_malformed_ones_carry_their_error():
    good = [event(n).model_dump_json().encode() for n in range(3)]
    values = [
        good[0],
        b"{not json",
        good[1],
        b'{"id": "x", "time": "2026-11-01T00:00:00Z"}',  # JSON, but not a usage event
        b"",  # a tombstone: empty value
        good[2],
    ]
    lines, rejected = split_valid(values)
    assert lines == good  # strict-form messages go on byte for byte
    assert [i for i, _ in rejected] == [1, 3, 4]
    assert "json" in rejected[0][1].lower()
    assert "account_id" in rejected[1][1] and "resource" in rejected[1][1]
    assert all(error for _, error in rejected)


def test_a_leniently_valid_message_goes_on_as_the_model_serialises_it():
    e = event(7)
    lenient = json.loads(e.model_dump_json())
    lenient["quantity"] = "7"  # a number as a string
    lenient["time"] = 1793491200  # a Unix time (2026-11-01T00:00:00Z)
    lines, rejected = split_valid([json.dumps(lenient).encode()])
    assert rejected == []
    assert lines == [e.model_dump_json().encode()]


def test_an_event_without_an_id_is_refused_not_given_a_random_one():
    body = json.loads(event(1).model_dump_json())
    del body["id"]  # the model would invent one, different at every redelivery
    lines, rejected = split_valid([json.dumps(body).encode()])
    assert lines == [] and [error for _, error in rejected] == [MISSING_ID]


def test_out_of_range_numbers_are_refused_not_wrapped():
    body = json.loads(event(1).model_dump_json())
    body["quantity"] = 2**63
    lines, rejected = split_valid([json.dumps(body).encode()])
    assert lines == [] and "quantity" in rejected[0][1]


def test_an_all_valid_batch_has_nothing_to_dead_letter():
    good = [event(n).model_dump_json().encode() for n in range(50)]
    lines, rejected = split_valid(good)
    assert lines == good and rejected == []


def test_a_lenient_message_without_an_id_is_refused_and_the_others_keep_their_places():
    lenient = json.loads(event(1).model_dump_json())
    del lenient["id"]
    lenient["quantity"] = "1"
    fine = event(2).model_dump_json().encode()
    rewritten = json.loads(event(3).model_dump_json())
    rewritten["quantity"] = "3"
    values = [json.dumps(lenient).encode(), fine, json.dumps(rewritten).encode()]
    verdict = judge(UsageEvent, values)
    assert verdict.rejected == [(0, MISSING_ID)]
    assert verdict.lines(values) == [fine, UsageEvent.model_validate(rewritten).model_dump_json().encode()]


def test_a_verdict_without_exceptions_writes_the_values_as_they_are():
    assert Verdict().lines([b"a", b"b"]) == [b"a", b"b"]


def test_a_batch_commits_the_offset_after_the_last_record_of_each_partition():
    offsets = {0: [5, 6, 9], 2: [40], 1: [7, 8], 3: []}
    fetched = {TopicPartition("usage.v1", p): [Record(b"", partition=p, offset=o) for o in os] for p, os in offsets.items()}
    batch = Batch.of(fetched)  # type: ignore[arg-type]
    assert {tp.partition: o for tp, o in batch.first.items()} == {0: 5, 1: 7, 2: 40}
    assert {tp.partition: o for tp, o in batch.next.items()} == {0: 10, 1: 9, 2: 41}


def test_the_dead_lettered_are_counted_by_reason():
    no_id = json.loads(event(1).model_dump_json())
    del no_id["id"]
    values = [
        b"{not json",
        json.dumps(no_id).encode(),
        event(2).model_dump_json().encode(),
        b"[]",
        event(3).model_dump_json().encode(),
    ]
    verdict = judge(UsageEvent, values, lambda i, _event: "too old" if i == 4 else None)
    assert verdict.reasons == {"malformed": 2, "missing_id": 1, "rules_broken": 1}
    assert [i for i, _ in verdict.rejected] == [0, 1, 3, 4]
