"""(v2) The rules a usage event must keep, judged identically on both ways in (API.md, "Usage
ingestion" and "Events"): POST /api/usage/events judges against now; every consumer of usage.v1
judges against the Kafka record's timestamp, so every consumer, at any replay, judges a record
the same way. Pure: no I/O, no clock.

Call events (calls.v1) keep the time rule alone, judged the same way by its consumers: the edge
stamps a call with its own clock, so only a broken or forged producer breaks it, and such a time
would otherwise reach any month (the metering tables' partitions, quota's periods).

The metering sink judges every record of a 50k batch, so the common case (nothing broken) costs
about a microsecond: instants are compared as integer microseconds since the epoch (comparing
aware datetimes with different tzinfo objects calls back into Python for each offset)."""

from datetime import UTC, datetime, timedelta

from contracts.common import STOCK_RESOURCES, Resource
from contracts.events import UsageEvent
from contracts.fast_events import Decoded, Usage

MAX_ABS_QUANTITY = 10**12
MAX_AHEAD = timedelta(minutes=5)
MAX_BEHIND = timedelta(days=35)

_US = 1_000_000
_AHEAD_US = 5 * 60 * _US
_BEHIND_US = 35 * 86_400 * _US
_EPOCH_ORDINAL = datetime(1970, 1, 1).toordinal()
_AI_TOKENS = Resource.AI_TOKENS  # a module global: an enum member's lookup costs more than the rule


def _epoch_us(t: datetime) -> int:
    """An aware instant as exact integer microseconds since the Unix epoch."""
    offset = t.utcoffset()
    assert offset is not None, "an aware datetime"
    days = t.toordinal() - _EPOCH_ORDINAL - offset.days
    seconds = t.hour * 3600 + t.minute * 60 + t.second - offset.seconds
    return (days * 86_400 + seconds) * _US + t.microsecond - offset.microseconds


def violations(event: UsageEvent, reference: datetime) -> list[str]:
    """The rules `event` breaks (empty: it may be counted), against the aware instant `reference`."""
    return violations_at(event, _epoch_us(reference))


def violations_at(event: Usage, reference_us: int) -> list[str]:
    """`violations` with the reference as microseconds since the epoch (a Kafka record's
    timestamp is milliseconds: `timestamp_ms * 1000`). One expression decides the common case
    (nothing broken): the sink pays for it on every record."""
    quantity = event.quantity
    i, o = event.input_tokens, event.output_tokens
    t = event.time
    offset = t.utcoffset()
    assert offset is not None, "an aware datetime"
    # _epoch_us(t), inlined: this is the hot path
    seconds = (t.toordinal() - _EPOCH_ORDINAL - offset.days) * 86_400 + t.hour * 3600 + t.minute * 60 + t.second
    delta = (seconds - offset.seconds) * _US + t.microsecond - offset.microseconds - reference_us
    if (
        0 <= quantity <= MAX_ABS_QUANTITY
        and (i is None or i <= MAX_ABS_QUANTITY)
        and (o is None or o <= MAX_ABS_QUANTITY)
        and (i is None or o is None or quantity == i + o or event.resource is not _AI_TOKENS)
        and -_BEHIND_US <= delta <= _AHEAD_US
    ):
        return []
    return _broken(event, delta, reference_us)


def _broken(event: Usage, delta: int, reference_us: int) -> list[str]:
    """Every rule `event` breaks, named (the rare case: no need to be quick)."""
    found: list[str] = []
    quantity = event.quantity
    if quantity < 0 and event.resource not in STOCK_RESOURCES:
        found.append(f"quantity: negative ({quantity}) on the flow resource {event.resource.value}")
    if quantity > MAX_ABS_QUANTITY or quantity < -MAX_ABS_QUANTITY:
        found.append(f"quantity: |{quantity}| is above 10^12")
    i, o = event.input_tokens, event.output_tokens
    # Token counts are summed by metering as the event's tokens (one alone is compared with
    # nothing): bounded as the quantity is, so that no sum of them wraps around.
    for name, count in (("input_tokens", i), ("output_tokens", o)):
        if count is not None and count > MAX_ABS_QUANTITY:
            found.append(f"{name}: {count} is above 10^12")
    if i is not None and o is not None and event.resource is _AI_TOKENS and quantity != i + o:
        found.append(f"quantity: {quantity} is not input_tokens + output_tokens ({i} + {o})")
    late_or_early = _time_broken(delta, reference_us)
    if late_or_early:
        found.append(late_or_early)
    return found


def time_violations_at(event: Decoded, reference_us: int) -> list[str]:
    """The time rule alone (calls.v1's rule), against a reference in microseconds since the epoch."""
    broken = _time_broken(_epoch_us(event.time) - reference_us, reference_us)
    return [] if broken is None else [broken]


def _time_broken(delta: int, reference_us: int) -> str | None:
    """The time rule's reason, for an event `delta` microseconds after the reference."""
    if delta > _AHEAD_US:
        return f"time: more than 5 minutes after {_instant(reference_us)}"
    if delta < -_BEHIND_US:
        return f"time: more than 35 days before {_instant(reference_us)}"
    return None


def _instant(epoch_us: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=epoch_us)).isoformat()


def record_time(timestamp_ms: int) -> datetime:
    """A Kafka record's timestamp (ms since the epoch) as the aware instant the rules judge by."""
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC)
