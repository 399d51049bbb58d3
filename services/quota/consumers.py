"""Quota's subscribers: usage.v1 + calls.v1 in batches, billing.v1 one event at a time.

Offsets are committed only after the batch is written (AckPolicy.NACK_ON_ERROR: a failure
rewinds to the batch's first record, and the processed-ids table makes the replay harmless).
Malformed records, and usage events that break a rule of contracts/usage_rules.py (judged against
the record's own timestamp, like every consumer of usage.v1), go to the dead-letter topic with the
reason and the batch goes on without them: nothing of theirs is counted.
"""

from collections.abc import Callable

from faststream import AckPolicy
from faststream.kafka import KafkaRouter
from faststream.kafka.annotations import KafkaMessage

from contracts.events import BILLING_EVENTS, CallEvent, PackagePurchased, PlanChanged, UsageEvent
from contracts.topics import BILLING, CALLS, USAGE, Topic
from contracts.usage_rules import violations_at
from services.quota.service import QuotaService
from services.runtime.platform.deadletter import parse_or_dead_letter


def build_router(service: QuotaService) -> KafkaRouter:
    settings = service.settings
    broker = service.broker
    router = KafkaRouter()
    topics: dict[str, tuple[Topic, type[UsageEvent] | type[CallEvent]]] = {
        settings.topic(USAGE.name): (USAGE, UsageEvent),
        settings.topic(CALLS.name): (CALLS, CallEvent),
    }

    @router.subscriber(
        *topics,
        group_id=settings.group("quota.usage"),
        title="quota.usage",  # a group per subscriber: no rebalancing each other
        auto_offset_reset="earliest",
        batch=True,
        max_records=1000,
        # Neither is a latency floor (the broker answers a waiting fetch as soon as a record lands,
        # and getmany returns as soon as one is buffered); they only set how often an idle
        # consumer asks again: 10 ms cost an idle `serve` ~11% of a core (BENCHMARKS.md, "idle").
        batch_timeout_ms=500,
        fetch_max_wait_ms=500,
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_usage_and_calls(msg: KafkaMessage) -> None:
        records = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
        events: list[UsageEvent | CallEvent] = []
        for record in records:
            topic, model = topics[record.topic]
            rules = _usage_rules(record.timestamp) if topic is USAGE else None
            event: UsageEvent | CallEvent | None = await parse_or_dead_letter(
                broker, settings, topic, model, record.value or b"", key=record.key, rules=rules
            )
            if event is not None:
                events.append(event)
        await service.count(events)

    @router.subscriber(
        settings.topic(BILLING.name),
        group_id=settings.group("quota.billing"),
        title="quota.billing",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=500,
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_billing(msg: KafkaMessage) -> None:
        record = msg.raw_message
        assert not isinstance(record, tuple)
        event = await parse_or_dead_letter(broker, settings, BILLING, BILLING_EVENTS, record.value or b"", key=record.key)
        if isinstance(event, PlanChanged):
            await service.apply_plan(event)
        elif isinstance(event, PackagePurchased):
            await service.apply_package(event)
        # user_type_changed: nothing to count

    return router


def _usage_rules(timestamp_ms: int) -> Callable[[object], list[str]]:
    return lambda event: violations_at(event, timestamp_ms * 1000) if isinstance(event, UsageEvent) else []
