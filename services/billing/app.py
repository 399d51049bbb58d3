"""Wiring of the billing service."""

import logging
from pathlib import Path

from contracts.topics import STATE_OWNERS
from services.billing import api, consumers, domain
from services.billing.delivery import EdgeDelivery
from services.billing.payments import TestProvider
from services.billing.service import BillingService
from services.billing.store import BillingStore
from services.edge import Component, Runtime
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.pruner import Pruner
from services.runtime.platform.state_guard import StateGuard

log = logging.getLogger(__name__)
# How often each replica's renewal job looks for renewals to make or charge (BillingService.renew_all):
# a period's renewals are made within a minute of its start.
RENEWAL_INTERVAL_S = 60.0


def build(runtime: Runtime) -> Component:
    relay = OutboxRelay(runtime.pool, runtime.settings, "billing")
    provider = runtime.overrides.payment_provider or TestProvider()
    service = BillingService(
        BillingStore(runtime.pool),
        relay,
        runtime.edge.accounts,
        provider,
        runtime.clock,
        runtime.settings.tz,
        edge=EdgeDelivery(relay, runtime.edge),
    )
    keys = Pruner(
        runtime.pool,
        "billing",
        "idempotency_keys",
        key="id",
        column="created_at",
        keep_s=domain.RETENTION_SECONDS,
        interval_s=runtime.settings.prune_interval_seconds,
    )
    renewals = Periodic("billing:renewals", RENEWAL_INTERVAL_S, service.renew_all, what="renewing plans", log=log)
    # Kafka lost billing.v1: given again from Postgres (docs/architecture.md, "Kafka is transport")
    guard = StateGuard(
        runtime.settings,
        runtime.pool,
        runtime.broker,
        "billing",
        STATE_OWNERS["billing"],
        service.held_states,
        service.republish,
        hold=runtime.edge.rebuilding,
    )
    return Component(
        name="billing",
        router=api.build_router(runtime, service),
        subscribers=consumers.build_router(service, runtime.broker, runtime.settings),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start, guard.start, keys.start, renewals.start],
        on_stop=[renewals.stop, keys.stop, guard.stop, relay.stop],
    )
