"""Parse a consumed message into its contract model, or dead-letter it and move on.

A consumer must never stall on a message it cannot parse: it goes to `<topic>.dlq` with the
error and its origin in headers, and the consumer commits past it. So does a well-formed event
that breaks a rule of its contract (`rules`: e.g. contracts/usage_rules.py for usage.v1).
"""

import logging
from collections.abc import Callable
from typing import TypeVar

from faststream.kafka import KafkaBroker
from prometheus_client import Counter
from pydantic import BaseModel, TypeAdapter, ValidationError

from contracts.events import MISSING_ID, Event, has_id
from contracts.topics import ALL_TOPICS, Topic, dead_letter
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)
M = TypeVar("M")

# A record that (nearly) filled Kafka's message limit (1 MiB by default) would not fit in it again
# with the headers added: its dead-letter publish would fail at every redelivery and hold its
# consumer there for good. Beyond these sizes the dead letter keeps the record's head, and says
# how large it was; the whole record is still in its own topic. No contract event comes near them.
MAX_DEAD_LETTER_VALUE = 256 * 1024
MAX_DEAD_LETTER_KEY = 1024

DEAD_LETTERED = Counter(
    "tollgate_dead_lettered_total",
    "Messages any consumer sent to a dead-letter topic, by the topic they came from (unit: messages)",
    ["topic"],
)
for _topic in ALL_TOPICS:  # on /metrics at 0 from the start, so an alert can watch them
    DEAD_LETTERED.labels(_topic.name)


async def send_to_dead_letter(
    broker: KafkaBroker, settings: Settings, topic: Topic, raw: bytes, error: str, *, key: bytes | None = None
) -> None:
    headers = {"x-error": error[:1000], "x-original-topic": settings.topic(topic.name)}
    if len(raw) > MAX_DEAD_LETTER_VALUE:
        headers["x-truncated-from"] = str(len(raw))
        raw = raw[:MAX_DEAD_LETTER_VALUE]
    if key is not None and len(key) > MAX_DEAD_LETTER_KEY:
        headers["x-key-truncated-from"] = str(len(key))
        key = key[:MAX_DEAD_LETTER_KEY]
    await broker.publish(raw, settings.topic(dead_letter(topic).name), key=key, headers=headers)
    DEAD_LETTERED.labels(topic.name).inc()
    log.warning("dead-lettered a message from %s: %s", topic.name, error[:200])


def parse(model: type[M] | TypeAdapter[M], raw: bytes, first_pass: Callable[[bytes], M | None] | None = None) -> M:
    """Validate one raw JSON message; raises ValidationError (or ValueError) if it is malformed,
    or if it is an event without its id (the idempotency key).

    `first_pass`: a faster decoder that accepts a subset of what `model` accepts strictly, to the
    same values, with its id (contracts/fast_events.py), and returns None for the rest; the model
    then judges the message as it would alone."""
    if first_pass is not None and (fast := first_pass(raw)) is not None:
        return fast
    if isinstance(model, TypeAdapter):
        value = model.validate_json(raw)
    else:
        assert issubclass(model, BaseModel)
        value = model.model_validate_json(raw)
    if isinstance(value, Event) and not has_id(value):
        raise ValueError(MISSING_ID)
    return value


async def parse_or_dead_letter(
    broker: KafkaBroker,
    settings: Settings,
    topic: Topic,
    model: type[M] | TypeAdapter[M],
    raw: bytes,
    *,
    key: bytes | None = None,
    rules: Callable[[M], list[str]] | None = None,
    first_pass: Callable[[bytes], M | None] | None = None,
) -> M | None:
    """The parsed event, or None once it is dead-lettered: malformed, or (with `rules`) breaking
    one of them (the reasons, joined, are the x-error header)."""
    try:
        value = parse(model, raw, first_pass)
    except (ValidationError, ValueError) as exc:
        await send_to_dead_letter(broker, settings, topic, raw, str(exc), key=key)
        return None
    broken = rules(value) if rules is not None else None
    if broken:
        await send_to_dead_letter(broker, settings, topic, raw, "; ".join(broken), key=key)
        return None
    return value
