"""Quota's subscribers: usage.v1 + calls.v1 in batches, billing.v1 and (v4) keys.v1 one event at a time.

Usage events that break a rule of contracts/usage_rules.py, and call events that break its time
rule (judged against the record's own timestamp, like every consumer of usage.v1 and calls.v1)
go to the dead-letter topic with the reason, like
malformed records, and the batch goes on without them: nothing of theirs is counted. A failed
batch is consumed again; the processed-ids table makes the replay harmless.
"""

from faststream.kafka import KafkaBroker, KafkaRouter
from prometheus_client import Counter

from contracts.events import BILLING_EVENTS, BillingEvent, CallEvent, KeyState, PackagePurchased, PlanChanged, UsageEvent
from contracts.topics import BILLING, CALLS, KEYS, USAGE
from contracts.usage_rules import time_violations_at, violations_at
from services.quota.service import QuotaService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber

COUNTED = Counter(
    "tollgate_quota_events_counted_total",
    "usage.v1 and calls.v1 events the quota consumer counted (a replayed batch counts again), by topic (unit: events)",
    ["topic"],
)
for _topic in (USAGE, CALLS):  # on /metrics at 0 from the start
    COUNTED.labels(_topic.name)


def _usage_rules(event: UsageEvent, timestamp_ms: int) -> list[str]:
    return violations_at(event, timestamp_ms * 1000)


def _call_rules(event: CallEvent, timestamp_ms: int) -> list[str]:
    return time_violations_at(event, timestamp_ms * 1000)


def build_router(service: QuotaService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_billing(event: BillingEvent) -> None:
        if isinstance(event, PlanChanged):
            await service.apply_plan(event)
        elif isinstance(event, PackagePurchased):
            await service.apply_package(event)
        # user_type_changed: nothing to count

    async def count(events: list[UsageEvent | CallEvent]) -> None:
        await service.count(events)
        calls = sum(1 for event in events if isinstance(event, CallEvent))
        COUNTED.labels(CALLS.name).inc(calls)
        COUNTED.labels(USAGE.name).inc(len(events) - calls)

    subscribe.batches(
        {USAGE: Reading(UsageEvent, _usage_rules), CALLS: Reading(CallEvent, _call_rules)},
        group="quota.usage",  # a group per subscriber: no rebalancing each other
        handle=count,
        max_records=1000,
    )
    subscribe.each(BILLING, Reading(BILLING_EVENTS), group="quota.billing", handle=on_billing)
    # (v4) each key's limits (a projection: the newest state by order_of wins, so a replay is harmless)
    subscribe.each(KEYS, Reading(KeyState), group="quota.keys", handle=service.apply_key)
    return subscribe.router
