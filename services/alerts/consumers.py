"""Subscribers: quota.v1 (latest usage per resource), quota-thresholds.v1 (fire rules) and (v2)
keys.v1 (key ages, for the rotation reminder), each
through the one subscribe helper (offsets committed after the transaction, malformed events to
the dead-letter topic)."""

from faststream.kafka import KafkaBroker, KafkaRouter

from contracts.events import QUOTA_RECORDS, KeyState, QuotaRecord, QuotaState, QuotaThresholdCrossed
from contracts.topics import KEYS, QUOTA, QUOTA_THRESHOLDS
from services.alerts.service import AlertsService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber


def build_router(service: AlertsService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_quota(record: QuotaRecord) -> None:
        # (v4) a key's standing (KeyQuotaState) is valid but not alerts' business: key rules fire
        # from quota-thresholds.v1 crossings alone, so it is skipped, never dead-lettered
        if isinstance(record, QuotaState):
            await service.save_quota_state(record)

    subscribe.each(
        QUOTA_THRESHOLDS,
        Reading(QuotaThresholdCrossed),
        group="alerts.thresholds",
        title="alerts.on_threshold",
        handle=service.fire_crossing,
    )
    subscribe.each(QUOTA, Reading(QUOTA_RECORDS), group="alerts.quota", title="alerts.on_quota_state", handle=on_quota)
    subscribe.each(KEYS, Reading(KeyState), group="alerts.keys", handle=service.save_key)
    return subscribe.router
