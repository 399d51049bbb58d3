"""The demo account's planned usage (services/runtime/host/demo_data.py): seven days of it, inside
the usage rules, and the same events for the same hour at every run (so re-runs are duplicates)."""

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from contracts.events import UsageEvent
from contracts.usage_rules import violations
from services.runtime.host.demo_data import BATCH, planned_usage

ACCOUNT = uuid.UUID("00000000-0000-4000-8000-00000000d3e0")
KEY = uuid.UUID("00000000-0000-4000-8000-0000000000aa")
NOW = datetime(2026, 3, 4, 10, 17, 42, tzinfo=UTC)


def test_seven_days_of_usage_inside_the_usage_rules_across_3_providers_and_6_models() -> None:
    events = planned_usage(ACCOUNT, NOW, KEY)
    assert 0 < len(events) <= BATCH  # one request
    parsed = [UsageEvent.model_validate(e) for e in events]
    assert all(violations(e, NOW) == [] for e in parsed)
    assert len({e.id for e in parsed}) == len(parsed)
    assert {e.provider for e in parsed} == {"openai", "anthropic", "google"}
    assert len({(e.provider, e.model) for e in parsed}) == 6
    assert min(e.time for e in parsed) >= NOW - timedelta(days=7)
    assert max(e.time for e in parsed) <= NOW
    # every hour of the seven days has some usage (no hole in the week, nor in "today")
    hours = Counter(e.time.replace(minute=0, second=0, microsecond=0) for e in parsed)
    assert len(hours) == 7 * 24
    assert NOW.replace(minute=0, second=0, microsecond=0) in hours
    # some of it through the demo app's key, some without a key
    assert {e.api_key_id for e in parsed} == {KEY, None}


def test_an_hour_plans_the_same_events_at_every_run() -> None:
    first = {e["id"]: e for e in planned_usage(ACCOUNT, NOW, KEY)}
    later = {e["id"]: e for e in planned_usage(ACCOUNT, NOW + timedelta(days=1, minutes=30), KEY)}
    shared = first.keys() & later.keys()
    # six days overlap: their events are the very same ones (the current hour's, moved back to
    # `now` at the first run, keep their id and stay in their hour)
    assert len(shared) > len(first) * 0.7
    for event_id in shared:
        a, b = first[event_id], later[event_id]
        if a["time"] != b["time"]:
            assert datetime.fromisoformat(a["time"]) == NOW
            assert datetime.fromisoformat(b["time"]).replace(minute=0, second=0) == NOW.replace(minute=0, second=0, microsecond=0)
        assert {k: v for k, v in a.items() if k != "time"} == {k: v for k, v in b.items() if k != "time"}
    # another account's events are other events
    assert not first.keys() & {e["id"] for e in planned_usage(uuid.uuid4(), NOW, KEY)}


def test_without_a_key_the_same_events_carry_none() -> None:
    with_key = planned_usage(ACCOUNT, NOW, KEY)
    without = planned_usage(ACCOUNT, NOW)
    assert [e["id"] for e in with_key] == [e["id"] for e in without]
    assert all("api_key_id" not in e for e in without)
