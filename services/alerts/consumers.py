"""Subscribers: quota.v1 (latest usage per resource), quota-thresholds.v1 (fire rules) and (v2)
keys.v1 (key ages, for the rotation reminder), each
through the one subscribe helper (offsets committed after the transaction, malformed events to
the dead-letter topic)."""

from faststream.kafka import KafkaBroker, KafkaRouter

from contracts.events import KeyState, QuotaState, QuotaThresholdCrossed
from contracts.topics import KEYS, QUOTA, QUOTA_THRESHOLDS
from services.alerts.service import AlertsService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber


def build_router(service: AlertsService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)
    subscribe.each(
        QUOTA_THRESHOLDS,
        Reading(QuotaThresholdCrossed),
        group="alerts.thresholds",
        title="alerts.on_threshold",
        handle=service.fire_crossing,
    )
    subscribe.each(
        QUOTA, Reading(QuotaState), group="alerts.quota", title="alerts.on_quota_state", handle=service.save_quota_state
    )
    subscribe.each(KEYS, Reading(KeyState), group="alerts.keys", handle=service.save_key)
    return subscribe.router
