"""Quota's subscribers: usage.v1 and calls.v1 in batches, billing.v1 and (v4) keys.v1 one event at a time.

usage.v1 is counted as it comes: a usage event's block must reach every edge within 100 ms. calls.v1
is gathered for up to a second (issue 38, decision 2): the edges admit api_calls themselves,
exactly, in Redis (services/edge/admissions.py), so quota's count of calls blocks nothing on its
own; a trickle of calls then costs one transaction, one quota.v1 state and one commit a second,
not one per call (docs/architecture.md, "Consumers batch").

Usage events that break a rule of contracts/usage_rules.py, and call events that break its time
rule (judged against the record's own timestamp, like every consumer of usage.v1 and calls.v1)
go to the dead-letter topic with the reason, like
malformed records, and the batch goes on without them: nothing of theirs is counted. A failed
batch is consumed again; the processed-ids table makes the replay harmless.
"""

from collections.abc import Awaitable, Callable

from faststream.kafka import KafkaBroker, KafkaRouter
from prometheus_client import Counter

from contracts.events import BILLING_EVENTS, BillingEvent, CallEvent, KeyState, PackagePurchased, PlanChanged, UsageEvent
from contracts.fast_events import Call, Usage, decode_call, decode_usage
from contracts.topics import BILLING, CALLS, KEYS, USAGE, Topic
from contracts.usage_rules import time_violations_at, violations_at
from services.quota.domain import Counted
from services.quota.service import QuotaService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber

CALLS_GATHER_MS = 1000
# calls.v1 was read by USAGE_GROUP with usage.v1 before it had a group of its own: an existing
# deployment hands it over where it left off (app.py, runtime/platform/group_handover.py).
USAGE_GROUP, CALLS_GROUP = "quota.usage", "quota.calls"

COUNTED = Counter(
    "tollgate_quota_events_counted_total",
    "usage.v1 and calls.v1 events the quota consumer counted (a replayed batch counts again), by topic (unit: events)",
    ["topic"],
)
for _topic in (USAGE, CALLS):  # on /metrics at 0 from the start
    COUNTED.labels(_topic.name)


def _usage_rules(event: Usage, timestamp_ms: int) -> list[str]:
    return violations_at(event, timestamp_ms * 1000)


def _call_rules(event: Call, timestamp_ms: int) -> list[str]:
    return time_violations_at(event, timestamp_ms * 1000)


# (issue 38, decision 4) A message is decoded by the model's msgspec mirror first, several times
# faster; what the mirror does not take, the model judges as before. The same messages are counted
# and dead-lettered (with the same reasons), with the same values: tests/unit/test_quota_decode.py.
USAGE_READING: Reading[Usage] = Reading(UsageEvent, _usage_rules, decode_usage)
CALLS_READING: Reading[Call] = Reading(CallEvent, _call_rules, decode_call)


def counter(service: QuotaService, topic: Topic) -> Callable[[list[Counted]], Awaitable[None]]:
    """The handler of one topic's batches: counted by the service, then on the topic's metric."""
    counted = COUNTED.labels(topic.name)

    async def count(events: list[Counted]) -> None:
        await service.count(events)
        counted.inc(len(events))

    return count


def build_router(service: QuotaService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_billing(event: BillingEvent) -> None:
        if isinstance(event, PlanChanged):
            await service.apply_plan(event)
        elif isinstance(event, PackagePurchased):
            await service.apply_package(event)
        # user_type_changed: nothing to count

    # a group per subscriber: no rebalancing each other
    subscribe.batches({USAGE: USAGE_READING}, group=USAGE_GROUP, handle=counter(service, USAGE), max_records=1000)
    subscribe.batches(
        {CALLS: CALLS_READING}, group=CALLS_GROUP, handle=counter(service, CALLS), max_records=1000, gather_ms=CALLS_GATHER_MS
    )
    subscribe.each(BILLING, Reading(BILLING_EVENTS), group="quota.billing", handle=on_billing)
    # (v4) each key's limits (a projection: the newest state by order_of wins, so a replay is harmless)
    subscribe.each(KEYS, Reading(KeyState), group="quota.keys", handle=service.apply_key)
    return subscribe.router
