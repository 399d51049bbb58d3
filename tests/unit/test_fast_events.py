"""(issue 38, decision 4) The metering sink's msgspec first pass against the pydantic path it
speeds up, differentially: the same verdict (what is written, rewritten, dead-lettered and why,
what is flagged) with the first pass and without it, for every usage and call fixture the repo
has, the hostile ones, and a hypothesis run of valid, near-valid and malformed JSON. And the
subset the first pass rests on: whatever a mirror accepts, the contract's model accepts in
strict mode, to the same values."""

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from unittest.mock import patch

from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.common import Resource
from contracts.events import CallEvent, Event, UsageEvent
from contracts.fast_events import FastCall, FastUsage, fast_decoder
from services.metering import validation
from services.metering.ingest import call_rules, model_flag, usage_rules
from services.metering.validation import Verdict, judge
from tests.hostile.test_kafka_garbage import _garbage, _huge
from tests.support.backfill import call as backfill_call
from tests.support.backfill import usage as backfill_usage
from tests.support.platform import usage_event as platform_usage_event
from tests.unit import test_metering_sink_parse as sink_parse
from tests.unit import test_usage_rules as rules_tests
from tests.unit.fakes import FakeClock

NOW = FakeClock().now
STAMP_MS = int(NOW.timestamp() * 1000)
ACCOUNT, NARROW_KEY = uuid.uuid4(), uuid.uuid4()
ALLOWED = {(ACCOUNT, NARROW_KEY): ("openai/*",)}
FLAG = model_flag(lambda account, key: ALLOWED.get((account, key), ()))


def record(value: bytes, timestamp_ms: int = STAMP_MS, offset: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("t", 0, offset, timestamp_ms, 0, b"k", value, None, len(value), -1, [])


def verdicts(model: type[Event], values: Sequence[bytes], stamps: Sequence[int] | None = None) -> tuple[Verdict, Verdict]:
    """The verdict of the sink's validation with the first pass, and without it (the old path)."""
    records = [record(v, stamps[i] if stamps else STAMP_MS, i) for i, v in enumerate(values)]
    rules = usage_rules(records) if model is UsageEvent else call_rules(records)
    flag = FLAG if model is UsageEvent else None
    new = judge(model, values, rules, flag)
    with patch.object(validation, "fast_decoder", lambda _model: None):
        old = judge(model, values, rules, flag)
    return new, old


def assert_same(model: type[Event], values: Sequence[bytes], stamps: Sequence[int] | None = None) -> Verdict:
    new, old = verdicts(model, values, stamps)
    assert new == old
    assert new.lines(values) == old.lines(values)
    for value in values:
        assert_subset(model, value)
    return new


def assert_subset(model: type[Event], value: bytes) -> None:
    """What the mirror accepts, the model accepts strictly, field by field to the same value (and
    a time to the same instant at the same offset)."""
    fast = fast_decoder(model)
    assert fast is not None
    mirrored = fast(value)
    if mirrored is None:
        return
    try:
        parsed = model.__pydantic_validator__.validate_json(value, strict=True)
    except ValidationError as exc:  # pragma: no cover - the failure this test exists to catch
        raise AssertionError(f"the mirror accepted what the model refuses: {value!r}\n{exc}") from exc
    assert "id" in parsed.__pydantic_fields_set__
    for name in type(mirrored).__struct_fields__:
        ours, theirs = getattr(mirrored, name), getattr(parsed, name)
        assert (ours == theirs and type(ours) is type(theirs)) or isinstance(ours, datetime), (name, ours, theirs)
    assert mirrored.time == parsed.time and mirrored.time.utcoffset() == parsed.time.utcoffset()
    assert (mirrored.time.year, mirrored.time.microsecond) == (parsed.time.year, parsed.time.microsecond)


# ---- every fixture ---------------------------------------------------------------------------------
def usage_fixtures() -> list[bytes]:
    dumped = [
        sink_parse.event(7),
        rules_tests.event(input_tokens=10, output_tokens=20, time=NOW),
        rules_tests.event(Resource.STORAGE_BYTES, -5, time=NOW),
        rules_tests.event(quantity=31, input_tokens=10, output_tokens=20, time=NOW),
        rules_tests.event(quantity=10**12 + 1, time=NOW),
        rules_tests.event(Resource.API_CALLS, -1, time=NOW),
        rules_tests.event(time=NOW + timedelta(minutes=5, microseconds=1)),
        rules_tests.event(time=NOW - timedelta(days=35, microseconds=1)),
        rules_tests.event(time=NOW - timedelta(days=35)),
        rules_tests.event(time=(NOW + timedelta(minutes=5)).astimezone(timezone(timedelta(hours=-11)))),
        backfill_usage(ACCOUNT, 3),
        UsageEvent(
            time=NOW,
            account_id=ACCOUNT,
            resource=Resource.AI_TOKENS,
            quantity=30,
            provider="anthropic",
            model="claude-x",
            input_tokens=10,
            output_tokens=20,
            source="flagged",
            api_key_id=NARROW_KEY,
            reservation_id=uuid.uuid4(),
        ),
        UsageEvent(
            time=NOW, account_id=ACCOUNT, resource=Resource.AI_TOKENS, quantity=1, model="x", source="s", api_key_id=NARROW_KEY
        ),
    ]
    values = [e.model_dump_json().encode() for e in dumped]
    values += [json.dumps(e.model_dump(mode="json"), indent=1).encode() for e in dumped[:3]]  # spaced out
    # the hostile test's garbage and the sink-parse tests' malformed and lenient messages
    values += [*_garbage("marker").values(), _huge("marker"), b"{not json", b"", b"[]", b"null"]
    values.append(b'{"id": "x", "time": "2026-11-01T00:00:00Z"}')
    body = json.loads(sink_parse.event(3).model_dump_json())
    values += [json.dumps({**body, "quantity": "3"}).encode(), json.dumps({**body, "time": 1793491200}).encode()]
    values += [
        json.dumps({k: v for k, v in body.items() if k != "id"}).encode(),
        json.dumps({**body, "quantity": 2**63}).encode(),
    ]
    # the way other tests and services write them: isoformat with +00:00, extra fields, no nulls
    platform = platform_usage_event(str(ACCOUNT), 42)
    values += [json.dumps(platform).encode(), json.dumps({**platform, "time": NOW.isoformat()}).encode()]
    values += [json.dumps({**body, "marker": "extra"}).encode()]
    return values


def call_fixtures() -> list[bytes]:
    def call(**fields: Any) -> CallEvent:
        base: dict[str, Any] = {
            "time": NOW,
            "account_id": ACCOUNT,
            "api_key_id": uuid.uuid4(),
            "method": "GET",
            "path": "/api/geo/projects",
            "status": 200,
            "ip": "10.0.0.1",
            "latency_ms": 1.5,
        }
        return CallEvent(**{**base, **fields})

    dumped = [
        call(),
        call(time=NOW - timedelta(days=400)),
        call(time=NOW + timedelta(minutes=6)),
        call(status=429, error_code="rate_limited", count=17, service="geo"),
        call(latency_ms=0, user_agent="curl/8.5", ip="::1"),
        backfill_call(ACCOUNT, 5),
    ]
    values = [e.model_dump_json().encode() for e in dumped]
    body = json.loads(dumped[0].model_dump_json())
    values += [
        json.dumps({**body, "latency_ms": 2}).encode(),  # an integer latency
        json.dumps({**body, "latency_ms": "1.5"}).encode(),
        json.dumps({**body, "status": 600}).encode(),
        json.dumps({**body, "count": 0}).encode(),
        json.dumps({**body, "latency_ms": 1e400}).encode(),
        json.dumps({**body, "latency_ms": -0.0}).encode(),
        json.dumps({**body, "latency_ms": float("inf")}).encode(),  # Infinity: not JSON, pydantic's parser reads it
        json.dumps({**body, "latency_ms": float("nan")}).encode(),
    ]
    return values + list(_garbage("marker").values()) + [b"", b"{}"]


def test_every_usage_fixture_gets_the_same_verdict_both_ways():
    verdict = assert_same(UsageEvent, usage_fixtures())
    assert verdict.rejected and verdict.rewritten and verdict.flagged  # the fixtures reach every branch


def test_every_call_fixture_gets_the_same_verdict_both_ways():
    verdict = assert_same(CallEvent, call_fixtures())
    assert verdict.rejected


def test_a_backfill_judged_by_its_records_own_timestamps_gets_the_same_verdict():
    old = rules_tests.event(time=NOW - timedelta(days=400)).model_dump_json().encode()
    assert_same(UsageEvent, [old, old], [STAMP_MS, STAMP_MS - 400 * 86_400_000])


def test_the_first_pass_takes_the_producers_own_form():
    """The point of it: a message as the platform's producers write it never reaches pydantic."""
    usage = fast_decoder(UsageEvent)
    calls = fast_decoder(CallEvent)
    assert usage is not None and calls is not None
    assert isinstance(usage(usage_fixtures()[0]), FastUsage)
    assert isinstance(calls(call_fixtures()[0]), FastCall)


# ---- the times and texts where the libraries part ---------------------------------------------------
SAMPLE = json.loads(sink_parse.event(3).model_dump_json())

TIMES = [
    "2026-11-26T10:00:00Z",
    "2026-11-26t10:00:00z",
    "2026-11-26 10:00:00Z",
    "2026-11-26T10:00Z",
    "2026-11-26T10:00:00.1Z",
    "2026-11-26T10:00:00.123456+05:30",
    "2026-11-26T10:00:00.1234565Z",  # msgspec rounds, pydantic truncates: the first pass steps aside
    "2026-11-26T10:00:00.9999999Z",
    "2026-11-26T10:00:00.123456789012Z",
    "2026-11-26T10:00:00+0100",
    "2026-11-26T10:00:00+01",
    "2026-11-26T10:00:00-00:00",
    "2026-11-26T10:00:00+23:59",
    "2026-11-26T10:00:00+24:00",
    "2026-11-26T24:00:00Z",
    "2026-11-26T23:59:60Z",
    "2026-11-26T10:00:00,5Z",
    "2026-11-26T10:00:00",  # naive
    "20261126T100000Z",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "2026-02-29T00:00:00Z",
    "2026-11-26T10:00:00+01:00:30",
    "2026-11-26",
    "1793491200",
    "2026-11-26T10:00:00.123456\\u0037Z",
]


def test_times_in_every_form_get_the_same_verdict():
    values = [json.dumps(SAMPLE).replace(SAMPLE["time"], t).encode() for t in TIMES]
    assert_same(UsageEvent, values, [STAMP_MS] * len(values))


def test_ids_texts_and_numbers_at_their_edges_get_the_same_verdict():
    raw = json.dumps(SAMPLE, separators=(",", ":"))
    assert '"quantity":3' in raw and '"source":"t"' in raw and '"provider":null' in raw
    some = SAMPLE["id"]
    ids = [some.upper(), some.replace("-", ""), "{" + some + "}", "urn:uuid:" + some, some[:8] + some[9:], "", some + " "]
    values = [raw.replace(some, other).encode() for other in ids]
    numbers = ["1.0", "1e2", "-0", "9223372036854775807", "9223372036854775808", "-9223372036854775809", "true", "null", '"3"']
    values += [raw.replace('"quantity":3', '"quantity":' + n).encode() for n in numbers]
    texts = [r"\ud800", r"\ud83d\ude00", r"\u0000", "\U0001f600" * 64, "\U0001f600" * 65, "", "e\u0301", "x" * 64, "x" * 65]
    values += [raw.replace('"source":"t"', '"source":"' + t + '"').encode() for t in texts]
    values += [raw.replace('"source":"t"', '"source":"s","source":"t"').encode()]  # a duplicate key: the last one counts
    values += [raw.replace('"quantity":3', '"quantity":3,"quantity":-3').encode()]
    values += [
        raw.encode() + b" \n",
        raw.encode() + b" x",
        b"\xef\xbb\xbf" + raw.encode(),
        raw.encode().replace(b'"t"', b'"\xff"'),
    ]
    values += [raw.replace('"type":"usage"', '"type":null').encode(), raw.replace('"ai_tokens"', '"AI_TOKENS"').encode()]
    values += [raw.replace('"provider":null', '"provider":"' + "p" * 65 + '"').encode()]
    values += [raw.replace('"source":"t"', '"sour\\u0063e":"t"').encode()]  # an escaped key
    assert_same(UsageEvent, values)


# ---- hypothesis: valid, near-valid and malformed ------------------------------------------------------
def _times() -> st.SearchStrategy[str]:
    aware = st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.sampled_from([UTC, None])
    ).map(lambda t: t.isoformat())
    near_now = st.integers(-40 * 86_400, 10 * 60).map(lambda s: (NOW + timedelta(seconds=s)).isoformat())
    digits = st.from_regex(r"\A\d{4}-\d{2}-\d{2}[T t]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}(:?\d{2})?)?\Z")
    return st.one_of(aware, near_now, digits, st.text(max_size=30))


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20), st.uuids().map(str)
)


def _field(name: str) -> st.SearchStrategy[Any]:
    """A plausible value for a field of either event, or something near it."""
    text_of = {"source": 70, "provider": 70, "model": 130, "method": 20, "ip": 70, "error_code": 70, "service": 210}
    if name in ("id", "account_id", "api_key_id", "reservation_id"):
        return st.one_of(
            st.uuids().map(str), st.uuids().map(lambda u: u.hex), st.uuids().map(lambda u: str(u).upper()), JSON_LEAVES
        )
    if name == "time":
        return _times()
    if name == "resource":
        return st.one_of(st.sampled_from([r.value for r in Resource]), JSON_LEAVES)
    if name in ("quantity", "input_tokens", "output_tokens", "status", "count"):
        edges = st.sampled_from([0, 1, -1, 10**12, 10**12 + 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1])
        return st.one_of(st.integers(-100, 700), edges, st.integers(), JSON_LEAVES)
    if name == "latency_ms":
        return st.one_of(st.floats(min_value=0, allow_nan=False, allow_infinity=False), st.integers(-5, 10**6), JSON_LEAVES)
    if name in text_of:
        return st.one_of(st.text(max_size=text_of[name]), st.text(alphabet="\U0001f600é", max_size=text_of[name]), JSON_LEAVES)
    if name in ("path", "user_agent"):
        return st.one_of(st.text(max_size=520), JSON_LEAVES)
    if name == "type":
        return st.sampled_from(["usage", "call", "", None])
    return JSON_LEAVES


def _documents(model: type[Event], sample: dict[str, Any]) -> st.SearchStrategy[bytes]:
    names = list(model.model_fields)

    @st.composite
    def document(draw: st.DrawFn) -> bytes:
        body = dict(sample)
        for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
            if draw(st.integers(0, 5)) == 0:
                body.pop(name, None)  # a missing field
            else:
                body[name] = draw(_field(name))
        if draw(st.integers(0, 7)) == 0:
            body[draw(st.text(max_size=8))] = draw(JSON_LEAVES)  # an unknown field
        text = json.dumps(body, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 0, 2])))
        damage = draw(st.integers(0, 9))
        if damage == 0 and text:  # cut short
            text = text[: draw(st.integers(0, len(text) - 1))]
        elif damage == 1:  # a byte flipped
            at = draw(st.integers(0, len(text) - 1))
            text = text[:at] + draw(st.sampled_from(['"', "\\", "}", ",", "0", " ", "\x00", "."])) + text[at + 1 :]
        return text.encode("utf-8", "surrogatepass")

    return document()


CHECKS = settings(suppress_health_check=[HealthCheck.too_slow])  # examples: the profile's (quick: 25, else 100)


def _stamps() -> st.SearchStrategy[int]:
    return st.integers(STAMP_MS - 86_400_000, STAMP_MS + 86_400_000)


@CHECKS
@given(st.lists(st.tuples(_documents(UsageEvent, json.loads(usage_fixtures()[1])), _stamps()), min_size=1, max_size=8))
def test_generated_usage_messages_get_the_same_verdict_both_ways(batch: list[tuple[bytes, int]]):
    assert_same(UsageEvent, [v for v, _ in batch], [s for _, s in batch])


@CHECKS
@given(st.lists(st.tuples(_documents(CallEvent, json.loads(call_fixtures()[3])), _stamps()), min_size=1, max_size=8))
def test_generated_call_messages_get_the_same_verdict_both_ways(batch: list[tuple[bytes, int]]):
    assert_same(CallEvent, [v for v, _ in batch], [s for _, s in batch])
