"""Wiring of the quota service."""

from pathlib import Path
from weakref import WeakKeyDictionary

from services.edge.component import Component, Runtime
from services.quota import api, consumers
from services.quota.domain import system_clock
from services.quota.service import QuotaService
from services.quota.sweeper import ReservationSweeper

_SERVICES: "WeakKeyDictionary[Runtime, QuotaService]" = WeakKeyDictionary()


def service_of(runtime: Runtime) -> QuotaService:
    """The quota service of a running app (tests swap its clock to change periods)."""
    return _SERVICES[runtime]


def build(runtime: Runtime) -> Component:
    service = QuotaService(runtime.pool, runtime.broker, runtime.settings, system_clock)
    _SERVICES[runtime] = service
    sweeper = ReservationSweeper(service)
    return Component(
        name="quota",
        router=api.build_router(runtime, service),
        subscribers=consumers.build_router(service),
        migrations=Path(__file__).parent / "migrations",
        on_start=[sweeper.start],
        on_stop=[sweeper.stop],
    )
