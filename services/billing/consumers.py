"""Billing's subscribers: the user type from accounts.v1 (registration on) and from keys'
user_type_changed on billing.v1. Both are applied only if newer than what billing has."""

from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaRouter
from faststream.kafka.annotations import KafkaMessage

from contracts.events import BILLING_EVENTS, AccountState, UserTypeChanged
from contracts.topics import ACCOUNTS, BILLING
from services.billing.service import BillingService
from services.runtime.platform.deadletter import parse_or_dead_letter


def build_router(service: BillingService, broker: KafkaBroker) -> KafkaRouter:
    settings = service.settings
    router = KafkaRouter()
    # One consumer group per subscriber: subscribers sharing a group would make each other
    # rebalance (a heartbeat's wait each) every time one of them starts or stops.

    @router.subscriber(
        settings.topic(ACCOUNTS.name),
        group_id=settings.group("billing.accounts"),
        title="billing.accounts",
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_account(msg: KafkaMessage) -> None:
        record = msg.raw_message
        assert not isinstance(record, tuple)
        if record.value is None:
            return  # a tombstone
        event = await parse_or_dead_letter(broker, settings, ACCOUNTS, AccountState, record.value, key=record.key)
        if event is not None:
            await service.apply_user_type(event)

    @router.subscriber(
        settings.topic(BILLING.name),
        group_id=settings.group("billing.user-types"),
        title="billing.user-types",
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_billing(msg: KafkaMessage) -> None:
        record = msg.raw_message
        assert not isinstance(record, tuple)
        event = await parse_or_dead_letter(broker, settings, BILLING, BILLING_EVENTS, record.value or b"", key=record.key)
        if isinstance(event, UserTypeChanged):
            await service.apply_user_type(event)

    return router
