"""Wiring of the billing service."""

from pathlib import Path
from weakref import WeakKeyDictionary

from services.billing import api, consumers, idempotency
from services.billing.payments import TestProvider
from services.billing.service import BillingService
from services.edge.component import Component, Runtime
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.pruner import Pruner

_SERVICES: "WeakKeyDictionary[Runtime, BillingService]" = WeakKeyDictionary()


def service_of(runtime: Runtime) -> BillingService:
    """The billing service of a running app (tests swap its clock or payment provider)."""
    return _SERVICES[runtime]


def build(runtime: Runtime) -> Component:
    relay = OutboxRelay(runtime.pool, runtime.settings, "billing")
    service = BillingService(runtime.pool, relay, runtime.settings, runtime.edge.accounts, TestProvider())
    _SERVICES[runtime] = service
    keys = Pruner(
        runtime.pool,
        "billing",
        "idempotency_keys",
        key="id",
        column="created_at",
        keep_s=idempotency.RETENTION_SECONDS,
        interval_s=runtime.settings.prune_interval_seconds,
    )
    return Component(
        name="billing",
        router=api.build_router(runtime, service),
        subscribers=consumers.build_router(service, runtime.broker),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start, keys.start],
        on_stop=[keys.stop, relay.stop],
    )
