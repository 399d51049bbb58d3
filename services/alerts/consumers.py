"""Subscribers: quota.v1 (latest usage per resource, in batches), quota-thresholds.v1 (fire rules), (v2)
keys.v1 (key ages, for the rotation reminder) and users.v1 (the accounts' users: a rule's `{user_id}`), each
through the one subscribe helper (offsets committed after the transaction, malformed events to
the dead-letter topic)."""

from faststream.kafka import KafkaBroker, KafkaRouter

from contracts.events import QUOTA_RECORDS, KeyState, QuotaRecord, QuotaState, QuotaThresholdCrossed, UserState
from contracts.topics import KEYS, QUOTA, QUOTA_THRESHOLDS, USERS
from services.alerts.service import AlertsService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber

QUOTA_STATES_GATHER_MS = 1000


def build_router(service: AlertsService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_quota(records: list[QuotaRecord]) -> None:
        # (v4) a key's standing (KeyQuotaState) is valid but not alerts' business: key rules fire
        # from quota-thresholds.v1 crossings alone, so it is skipped, never dead-lettered
        await service.save_quota_states([record for record in records if isinstance(record, QuotaState)])

    subscribe.each(
        QUOTA_THRESHOLDS,
        Reading(QuotaThresholdCrossed),
        group="alerts.thresholds",
        title="alerts.on_threshold",
        handle=service.fire_crossing,
    )
    # The states are kept for rules created later, which no latency bound waits on: gathered for
    # up to a second, a trickle of calls costs one transaction and one commit a second, not one
    # per call (docs/architecture.md, "Consumers batch"; BENCHMARKS.md, "http_load" round 20).
    subscribe.batches(
        {QUOTA: Reading(QUOTA_RECORDS)},
        group="alerts.quota",
        title="alerts.on_quota_state",
        handle=on_quota,
        gather_ms=QUOTA_STATES_GATHER_MS,
    )
    subscribe.each(KEYS, Reading(KeyState), group="alerts.keys", handle=service.save_key)
    subscribe.each(USERS, Reading(UserState), group="alerts.users", handle=service.save_user)
    return subscribe.router
