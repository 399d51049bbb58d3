"""The sink's batch parse: every raw message validated once; malformed ones come back with
their error (for the dead-letter topic) and never stop the valid ones around them."""

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from contracts.common import Resource
from contracts.events import UsageEvent
from services.metering.consumers import split_valid


@dataclass
class Record:
    value: bytes | None
    key: bytes | None = None


def event(n: int) -> UsageEvent:
    return UsageEvent(
        time=datetime(2026, 11, 1, tzinfo=UTC), account_id=uuid.uuid4(), resource=Resource.AI_TOKENS, quantity=n, source="t"
    )


def test_valid_events_keep_their_order_and_malformed_ones_carry_their_error():
    good = [event(n) for n in range(3)]
    records = [
        Record(good[0].model_dump_json().encode()),
        Record(b"{not json"),
        Record(good[1].model_dump_json().encode()),
        Record(b'{"id": "x", "time": "2026-11-01T00:00:00Z"}'),  # JSON, but not a usage event
        Record(None),  # a tombstone: empty value
        Record(good[2].model_dump_json().encode()),
    ]
    events, rejected = split_valid(UsageEvent.model_validate_json, records)
    assert events == good
    assert [r for r, _ in rejected] == [records[1], records[3], records[4]]
    assert "json" in rejected[0][1].lower()
    assert "account_id" in rejected[1][1] and "resource" in rejected[1][1]
    assert all(error for _, error in rejected)


def test_an_all_valid_batch_has_nothing_to_dead_letter():
    good = [event(n) for n in range(50)]
    events, rejected = split_valid(UsageEvent.model_validate_json, [Record(e.model_dump_json().encode()) for e in good])
    assert events == good and rejected == []
