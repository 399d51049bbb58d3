"""Billing's subscribers: the user type from accounts.v1 (registration on) and from keys'
user_type_changed on billing.v1. Both are applied only if newer than what billing has."""

from faststream.kafka import KafkaBroker, KafkaRouter

from contracts.events import BILLING_EVENTS, AccountState, BillingEvent, UserTypeChanged
from contracts.topics import ACCOUNTS, BILLING
from services.billing.service import BillingService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber


def build_router(service: BillingService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_billing(event: BillingEvent) -> None:
        if isinstance(event, UserTypeChanged):
            await service.apply_user_type(event)

    subscribe.each(ACCOUNTS, Reading(AccountState), group="billing.accounts", handle=service.apply_user_type)
    subscribe.each(BILLING, Reading(BILLING_EVENTS), group="billing.user-types", handle=on_billing)
    return subscribe.router
