"""(issue 38, decision 4) msgspec mirrors of the two hot topics' models, usage.v1 and calls.v1: a
first pass that decodes a message several times faster than pydantic does.

Each mirror accepts a subset of what its pydantic model (contracts/events.py) accepts in strict
mode, and decodes it to the same values: the contract's model stays the judge. A message a mirror
does not accept is not refused by it: the caller hands it to the pydantic model, which accepts it
(leniently or strictly) or refuses it with the exact reason the dead-letter topic carries. So the
mirrors refuse more than the models wherever the two libraries could disagree:
- an unknown field (the models ignore it; msgspec would skip its value with a parser of its own);
- a missing `id` (the models invent one, and the consumer then refuses the event);
- a message with an escape (`\\`) anywhere, or a fraction of more than 6 digits (`.1234567`)
  anywhere: msgspec rounds a time's fraction to the microsecond where pydantic truncates it, and
  without escapes a time's text is the message's own bytes, so that search finds every such time.

tests/unit/test_fast_events.py proves the subset against every fixture and a hypothesis run.
"""

import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal, Protocol, TypeVar
from uuid import UUID

import msgspec

from contracts.common import Resource
from contracts.events import CallEvent, Event, UsageEvent

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Time = Annotated[datetime, msgspec.Meta(tz=True)]  # AwareDatetime: an offset is required


class Decoded(Protocol):
    """What a consumer reads of a decoded event, from either decoder."""

    @property
    def id(self) -> UUID: ...
    @property
    def time(self) -> datetime: ...
    @property
    def account_id(self) -> UUID: ...


class _Envelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """The fields every event has (contracts/events.py, Event); the others inherit its options."""

    id: UUID
    time: Time
    account_id: UUID


class FastUsage(_Envelope, frozen=True, kw_only=True):
    """UsageEvent, as the sink reads it."""

    type: Literal["usage"] = "usage"
    resource: Resource
    quantity: Int64
    provider: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    model: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    source: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    api_key_id: UUID | None = None
    reservation_id: UUID | None = None


class FastCall(_Envelope, frozen=True, kw_only=True):
    """CallEvent, as the sink reads it."""

    type: Literal["call"] = "call"
    api_key_id: UUID
    method: Annotated[str, msgspec.Meta(max_length=16)]
    path: Annotated[str, msgspec.Meta(max_length=512)]
    status: Annotated[int, msgspec.Meta(ge=100, le=599)]
    ip: Annotated[str, msgspec.Meta(max_length=64)]
    user_agent: Annotated[str, msgspec.Meta(max_length=512)] = ""
    latency_ms: Annotated[float, msgspec.Meta(ge=0)]
    error_code: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    count: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 1
    service: Annotated[str, msgspec.Meta(max_length=200)] | None = None


FastEvent = FastUsage | FastCall
F = TypeVar("F", FastUsage, FastCall)
Decode = Callable[[bytes], F | None]  # the event, or None: the contract's model judges the message

# A usage or call event as a consumer gets it: the contract's model, or its mirror (the same values).
Usage = UsageEvent | FastUsage
Call = CallEvent | FastCall

_LONG_FRACTION = re.compile(rb"\.[0-9]{7}").search  # a fraction msgspec would round (a literal first: a quick search)


def _decoder(struct: type[F]) -> Decode[F]:
    decode = msgspec.json.Decoder(struct).decode

    def fast(value: bytes) -> F | None:
        if b"\\" in value or _LONG_FRACTION(value) is not None:
            return None
        try:
            return decode(value)
        except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError; bad UTF-8 in a text
            return None

    return fast


decode_usage, decode_call = _decoder(FastUsage), _decoder(FastCall)
_DECODERS: dict[type[Event], Decode[FastUsage] | Decode[FastCall]] = {UsageEvent: decode_usage, CallEvent: decode_call}


def fast_decoder(model: type[Event]) -> Decode[FastUsage] | Decode[FastCall] | None:
    """The first pass for `model`'s messages, if it has one."""
    return _DECODERS.get(model)
