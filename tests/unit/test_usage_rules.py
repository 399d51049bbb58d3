"""contracts/usage_rules.py: the rules a usage event keeps on both ways in (HTTP and Kafka), by
example at each boundary and as properties over generated events."""

import uuid
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from contracts.common import STOCK_RESOURCES, Resource
from contracts.events import CallEvent, UsageEvent
from contracts.usage_rules import (
    MAX_ABS_QUANTITY,
    MAX_AHEAD,
    MAX_BEHIND,
    record_time,
    time_violations_at,
    violations,
    violations_at,
)

REF = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
FLOWS = [r for r in Resource if r not in STOCK_RESOURCES]


def event(resource: Resource = Resource.AI_TOKENS, quantity: int = 30, time: datetime = REF, **extra: object) -> UsageEvent:
    return UsageEvent(time=time, account_id=uuid.uuid4(), resource=resource, quantity=quantity, source="t", **extra)


def test_a_plain_event_breaks_nothing():
    assert violations(event(input_tokens=10, output_tokens=20), REF) == []
    assert violations(event(quantity=0), REF) == []


def test_negative_quantity_is_refused_on_flows_and_allowed_on_stocks():
    for resource in FLOWS:
        (reason,) = violations(event(resource, -1), REF)
        assert reason.startswith("quantity: negative") and resource.value in reason
    for resource in STOCK_RESOURCES:
        assert violations(event(resource, -5), REF) == []


def test_ai_tokens_must_equal_input_plus_output_when_both_are_given():
    (reason,) = violations(event(quantity=31, input_tokens=10, output_tokens=20), REF)
    assert "input_tokens + output_tokens" in reason
    assert violations(event(quantity=31, input_tokens=10), REF) == []  # one side alone: nothing to compare
    assert violations(event(quantity=31, output_tokens=20), REF) == []
    # only ai_tokens carries the meaning: another resource's token fields are informative
    assert violations(event(Resource.AI_CONVERSATIONS, 1, input_tokens=10, output_tokens=20), REF) == []


def test_token_counts_are_bounded_like_the_quantity():
    """A token count alone (the other side absent) is compared with nothing, and metering sums it
    as the event's tokens: up to 2^63 - 1 each, three events wrapped ClickHouse's UInt64 sums and
    an event of quantity 3 showed 9.2e18 tokens and a cost of trillions. Bounded at 10^12, on
    every resource (another's token fields are summed too)."""
    assert violations(event(quantity=3, input_tokens=MAX_ABS_QUANTITY), REF) == []
    (reason,) = violations(event(quantity=3, input_tokens=MAX_ABS_QUANTITY + 1), REF)
    assert reason == f"input_tokens: {MAX_ABS_QUANTITY + 1} is above 10^12"
    (reason,) = violations(event(Resource.AI_CONVERSATIONS, 1, output_tokens=2**63 - 1), REF)
    assert reason == f"output_tokens: {2**63 - 1} is above 10^12"
    both = violations(event(quantity=3, input_tokens=2**62, output_tokens=2**62), REF)
    assert [r.split(":")[0] for r in both] == ["input_tokens", "output_tokens", "quantity"]


def test_time_bounds_are_inclusive_at_exactly_five_minutes_and_35_days():
    assert violations(event(time=REF + MAX_AHEAD), REF) == []
    assert violations(event(time=REF - MAX_BEHIND), REF) == []
    (ahead,) = violations(event(time=REF + MAX_AHEAD + timedelta(microseconds=1)), REF)
    (behind,) = violations(event(time=REF - MAX_BEHIND - timedelta(microseconds=1)), REF)
    assert ahead.startswith("time: more than 5 minutes after")
    assert behind.startswith("time: more than 35 days before")
    assert MAX_AHEAD == timedelta(minutes=5) and MAX_BEHIND == timedelta(days=35)


def test_absurd_quantities_are_refused_both_ways():
    assert violations(event(quantity=MAX_ABS_QUANTITY), REF) == []
    assert violations(event(Resource.STORAGE_BYTES, -MAX_ABS_QUANTITY), REF) == []
    (reason,) = violations(event(quantity=MAX_ABS_QUANTITY + 1), REF)
    assert "10^12" in reason
    (reason,) = violations(event(Resource.STORAGE_BYTES, -MAX_ABS_QUANTITY - 1), REF)
    assert "10^12" in reason


def test_every_broken_rule_is_named():
    broken = violations(event(quantity=-(10**13), input_tokens=1, output_tokens=2, time=REF - timedelta(days=40)), REF)
    assert len(broken) == 4


def test_record_time_is_the_aware_instant_of_the_kafka_timestamp():
    assert record_time(int(REF.timestamp() * 1000)) == REF
    assert record_time(1_700_000_000_123).tzinfo is not None


# ---- properties ----------------------------------------------------------------------------------
offsets = st.integers(min_value=-60 * 24 * 3600 * 1000, max_value=60 * 24 * 3600 * 1000)  # ms around REF
quantities = st.integers(min_value=-(2 * MAX_ABS_QUANTITY), max_value=2 * MAX_ABS_QUANTITY)
tokens = st.integers(min_value=0, max_value=10**9)


@given(st.sampled_from(list(Resource)), quantities, offsets)
def test_an_event_is_valid_exactly_when_each_rule_holds(resource, quantity, offset_ms):
    time = REF + timedelta(milliseconds=offset_ms)
    valid = (
        (quantity >= 0 or resource in STOCK_RESOURCES)
        and abs(quantity) <= MAX_ABS_QUANTITY
        and REF - MAX_BEHIND <= time <= REF + MAX_AHEAD
    )
    assert (violations(event(resource, quantity, time), REF) == []) == valid


@given(tokens, tokens, st.integers(min_value=-5, max_value=5))
def test_split_tokens_agree_only_with_their_sum(i, o, delta):
    found = violations(event(quantity=i + o + delta, input_tokens=i, output_tokens=o), REF)
    assert (found == []) == (delta == 0)


@given(st.sampled_from(list(Resource)), quantities, offsets, offsets)
def test_the_verdict_depends_on_the_reference_only_through_the_time_rule(resource, quantity, offset_ms, shift_ms):
    """A replay judged against another record timestamp changes only the time verdict: two
    consumers with the same record agree, whatever their clocks."""
    e = event(resource, quantity, REF + timedelta(milliseconds=offset_ms))
    other = REF + timedelta(milliseconds=shift_ms)
    same_rules = [r for r in violations(e, REF) if not r.startswith("time:")]
    assert same_rules == [r for r in violations(e, other) if not r.startswith("time:")]
    assert violations(e, REF) == violations(e, REF)  # pure


@given(
    st.sampled_from(list(Resource)),
    quantities,
    st.none() | tokens,
    st.none() | tokens,
    offsets,
    st.sampled_from([0, 330, -480, 845]),  # minutes east of UTC: the instant, not the wall clock, counts
)
def test_the_quick_verdict_agrees_with_the_rules_one_by_one(resource, quantity, i, o, offset_ms, east_min):
    zone = timezone(timedelta(minutes=east_min))
    time = (REF + timedelta(milliseconds=offset_ms)).astimezone(zone)
    e = event(resource, quantity, time, input_tokens=i, output_tokens=o)
    expected = (
        (quantity >= 0 or resource in STOCK_RESOURCES)
        and abs(quantity) <= MAX_ABS_QUANTITY
        and not (resource is Resource.AI_TOKENS and i is not None and o is not None and quantity != i + o)
        and REF - MAX_BEHIND <= time <= REF + MAX_AHEAD
    )
    assert (violations(e, REF) == []) == expected
    assert violations_at(e, int(REF.timestamp()) * 1_000_000) == violations(e, REF)


@given(offsets, st.sampled_from([0, 330, -480, 845]))
def test_a_call_event_keeps_the_same_time_rule_as_a_usage_event(offset_ms, east_min):
    """calls.v1's rule is the usage rules' time window, with the same reasons."""
    time = (REF + timedelta(milliseconds=offset_ms)).astimezone(timezone(timedelta(minutes=east_min)))
    call = CallEvent(
        time=time, account_id=uuid.uuid4(), api_key_id=uuid.uuid4(), method="GET", path="/p", status=200, ip="::1", latency_ms=1
    )
    reference_us = int(REF.timestamp()) * 1_000_000
    assert time_violations_at(call, reference_us) == violations(event(time=time), REF)
