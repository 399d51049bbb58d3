"""Subscribers: quota.v1 (latest usage per resource) and quota-thresholds.v1 (fire rules).

Offsets are committed only after the Postgres transaction; an error nacks the message so it
is consumed again. A message that does not parse goes to the dead-letter topic.
"""

from faststream import AckPolicy
from faststream.kafka import KafkaRouter
from faststream.kafka.annotations import KafkaMessage

from contracts.events import QuotaState, QuotaThresholdCrossed
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.alerts import firing, store
from services.alerts.dispatcher import Dispatcher
from services.edge.component import Runtime
from services.runtime.platform.deadletter import parse_or_dead_letter


def _key(msg: KafkaMessage) -> bytes | None:
    record = msg.raw_message
    return None if isinstance(record, tuple) else record.key


def build_router(runtime: Runtime, dispatcher: Dispatcher) -> KafkaRouter:
    settings, pool, broker = runtime.settings, runtime.pool, runtime.broker
    router = KafkaRouter()

    @router.subscriber(
        settings.topic(QUOTA_THRESHOLDS.name),
        group_id=settings.group("alerts.thresholds"),
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
        fetch_max_wait_ms=500,
        title="alerts.on_threshold",
    )
    async def on_threshold(msg: KafkaMessage) -> None:
        event = await parse_or_dead_letter(broker, settings, QUOTA_THRESHOLDS, QuotaThresholdCrossed, msg.body, key=_key(msg))
        if event is None:
            return
        async with pool.connection() as conn, conn.transaction():
            delivery_ids = await firing.fire_crossing(conn, event)
        dispatcher.submit(delivery_ids)  # after the commit: a crash from here on leaves them pending

    @router.subscriber(
        settings.topic(QUOTA.name),
        group_id=settings.group("alerts.quota"),
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
        title="alerts.on_quota_state",
    )
    async def on_quota_state(msg: KafkaMessage) -> None:
        state = await parse_or_dead_letter(broker, settings, QUOTA, QuotaState, msg.body, key=_key(msg))
        if state is None:
            return
        async with pool.connection() as conn, conn.transaction():
            await store.save_quota_state(conn, state)

    return router
