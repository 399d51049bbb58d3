"""Wiring of the quota service."""

import logging
from pathlib import Path

from contracts.topics import CALLS, STATE_OWNERS
from services.edge import Component, Runtime
from services.quota import api, consumers
from services.quota.publisher import KafkaPublisher
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from services.runtime.platform.group_handover import GroupHandover
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.state_guard import StateGuard

log = logging.getLogger(__name__)


def quota_service(runtime: Runtime) -> QuotaService:
    """The use cases on the runtime's Postgres, Kafka and clock (tests and benchmarks build one too)."""
    settings = runtime.settings
    return QuotaService(
        QuotaStore(runtime.pool),
        KafkaPublisher(runtime.broker, settings),
        runtime.clock,
        settings.tz,
        settings.console_url,
        totals=runtime.edge.totals.total,
        keys=runtime.edge.keys.by_id,
    )


def build(runtime: Runtime) -> Component:
    service = quota_service(runtime)
    # Releases reservations at their expiry; one replica at a time does the work (QuotaService.expire).
    sweeper = Periodic("quota:reservation-sweeper", 1.0, service.expire_all, what="expiring reservations", log=log)
    # Kafka lost quota.v1: given again from Postgres (docs/architecture.md, "Kafka is transport")
    guard = StateGuard(
        runtime.settings,
        runtime.pool,
        runtime.broker,
        "quota",
        STATE_OWNERS["quota"],
        service.held_states,
        service.republish,
        hold=runtime.edge.rebuilding,
    )
    settings = runtime.settings
    calls_handover = GroupHandover(
        settings.kafka_bootstrap_servers,
        settings.topic(CALLS.name),
        settings.group(consumers.USAGE_GROUP),
        settings.group(consumers.CALLS_GROUP),
    )
    return Component(
        name="quota",
        router=api.build_router(runtime, service),
        subscribers=consumers.build_router(service, runtime.broker, runtime.settings),
        migrations=Path(__file__).parent / "migrations",
        on_start=[guard.start, sweeper.start],
        on_stop=[sweeper.stop, guard.stop],
        consumers=[calls_handover],  # before the subscribers start: they read calls.v1 from where it was left
    )
