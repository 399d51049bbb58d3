"""The sink's batch parse: every raw message validated once; malformed ones come back with
their error (for the dead-letter topic) and never stop the valid ones around them. What goes on
to the engine is the message as it came when it is in the contract's strict form, else the
model's own serialisation (so the engine never reads a form it could read differently)."""

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from contracts.common import Resource
from contracts.events import MISSING_ID, UsageEvent
from services.metering.consumers import split_valid
from services.metering.pipeline import Batch


@dataclass
class Record:
    value: bytes | None
    key: bytes | None = None
    topic: str = "usage.v1"
    partition: int = 0
    offset: int = 0


def event(n: int) -> UsageEvent:
    return UsageEvent(
        time=datetime(2026, 11, 1, tzinfo=UTC), account_id=uuid.uuid4(), resource=Resource.AI_TOKENS, quantity=n, source="t"
    )


def test_valid_events_keep_their_order_and_malformed_ones_carry_their_error():
    good = [event(n).model_dump_json().encode() for n in range(3)]
    records = [
        Record(good[0]),
        Record(b"{not json"),
        Record(good[1]),
        Record(b'{"id": "x", "time": "2026-11-01T00:00:00Z"}'),  # JSON, but not a usage event
        Record(None),  # a tombstone: empty value
        Record(good[2]),
    ]
    lines, rejected = split_valid(UsageEvent, records)
    assert lines == good  # strict-form messages go on byte for byte
    assert [r for r, _ in rejected] == [records[1], records[3], records[4]]
    assert "json" in rejected[0][1].lower()
    assert "account_id" in rejected[1][1] and "resource" in rejected[1][1]
    assert all(error for _, error in rejected)


def test_a_leniently_valid_message_goes_on_as_the_model_serialises_it():
    e = event(7)
    lenient = json.loads(e.model_dump_json())
    lenient["quantity"] = "7"  # a number as a string
    lenient["time"] = 1793491200  # a Unix time (2026-11-01T00:00:00Z)
    lines, rejected = split_valid(UsageEvent, [Record(json.dumps(lenient).encode())])
    assert rejected == []
    assert lines == [e.model_dump_json().encode()]


def test_an_event_without_an_id_is_refused_not_given_a_random_one():
    body = json.loads(event(1).model_dump_json())
    del body["id"]  # the model would invent one, different at every redelivery
    lines, rejected = split_valid(UsageEvent, [Record(json.dumps(body).encode())])
    assert lines == [] and [error for _, error in rejected] == [MISSING_ID]


def test_out_of_range_numbers_are_refused_not_wrapped():
    body = json.loads(event(1).model_dump_json())
    body["quantity"] = 2**63
    lines, rejected = split_valid(UsageEvent, [Record(json.dumps(body).encode())])
    assert lines == [] and "quantity" in rejected[0][1]


def test_an_all_valid_batch_has_nothing_to_dead_letter():
    good = [event(n).model_dump_json().encode() for n in range(50)]
    lines, rejected = split_valid(UsageEvent, [Record(v) for v in good])
    assert lines == good and rejected == []


def test_a_batch_commits_the_offset_after_the_last_record_of_each_partition():
    records = [Record(b"", partition=p, offset=o) for p, o in [(0, 5), (0, 6), (0, 9), (2, 40), (1, 7), (1, 8)]]
    batch = Batch.of([], records)
    assert {tp.partition: o for tp, o in batch.first.items()} == {0: 5, 1: 7, 2: 40}
    assert {tp.partition: o for tp, o in batch.next.items()} == {0: 10, 1: 9, 2: 41}
