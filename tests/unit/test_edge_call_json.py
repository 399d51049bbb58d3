"""(issue 38) A calls.v1 event's bytes as the edge sends them (`Call.event_json`, msgspec) against
the contract's model's (`Call.event().model_dump_json()`, the old path), differentially: the same
bytes for every call, or the same refusal where the model refuses one."""

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from contracts.events import CallEvent
from services.edge.calls import Call


def _call(**fields: object) -> Call:
    defaults: dict[str, object] = {
        "time": datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=UTC),
        "account_id": uuid.uuid4(),
        "api_key_id": uuid.uuid4(),
        "method": "GET",
        "path": "/v1/models",
        "status": 200,
        "ip": "203.0.113.7",
        "user_agent": "bench-verify",
        "latency_ms": 1.234,
    }
    return Call(**{**defaults, **fields})  # type: ignore[arg-type]


def _old(call: Call) -> bytes:
    return call.event().model_dump_json().encode()


def assert_same(call: Call) -> None:
    try:
        old = _old(call)
    except (ValidationError, PydanticSerializationError) as refused:
        with pytest.raises(type(refused)):
            call.event_json()
        return
    assert call.event_json() == old
    assert CallEvent.model_validate_json(call.event_json()).id == call.id  # the id it was given, kept


texts = st.text(st.characters(codec="utf-8"), max_size=600) | st.sampled_from(["", 'é\u2028\x7f\x00"\\', "a" * 700])
times = st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]))


@given(
    time=times,
    method=texts,
    path=texts,
    status=st.integers(0, 700),
    ip=texts,
    user_agent=texts,
    latency_ms=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e3) | st.sampled_from([0.0, 1e15, 1e16, 1e21]),
    error_code=st.none() | texts,
    count=st.integers(0, 2**31 + 1),
    service=st.none() | texts,
)
def test_the_same_bytes_as_the_model_or_the_same_refusal(
    time: datetime,
    method: str,
    path: str,
    status: int,
    ip: str,
    user_agent: str,
    latency_ms: float,
    error_code: str | None,
    count: int,
    service: str | None,
) -> None:
    assert_same(
        _call(
            time=time,
            method=method,
            path=path,
            status=status,
            ip=ip,
            user_agent=user_agent,
            latency_ms=latency_ms,
            error_code=error_code,
            count=count,
            service=service,
        )
    )


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"time": datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)},  # no fraction
        {"time": datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone(timedelta(seconds=30)))},  # pydantic rounds it
        {"time": datetime(2026, 11, 27, 12, 0, 0)},  # naive: the model refuses it
        {"latency_ms": 1e16},  # pydantic writes 1e+16
        {"latency_ms": -3.0},  # written as 0.0
        {"latency_ms": 1e-05},
        {"status": 99},
        {"count": 0},
        {"count": 7, "error_code": "rate_limited", "admitted": False, "status": 429},
        {"error_code": "x" * 65},
        {"service": "s" * 200},
        {"service": "s" * 201},
        {"user_agent": "\ud800"},  # a lone surrogate: neither writes it
        {"user_agent": "ü" * 600, "path": "/" + "p" * 600, "method": "PROPFIND-LONGER-THAN-16", "ip": "1" * 70},
    ],
)
def test_the_edges_of_the_contract(fields: dict[str, object]) -> None:
    assert_same(_call(**fields))


def test_a_retry_sends_the_same_event() -> None:
    call = _call()
    first = call.event_json()
    assert call.event_json() == first == _old(call)
