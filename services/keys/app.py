"""Wiring of the keys service."""

from pathlib import Path

from services.edge.component import Component, Runtime
from services.keys.api import router
from services.keys.consumers import subscribers
from services.keys.service import KeysService


def build(runtime: Runtime) -> Component:
    service = KeysService(runtime.pool, runtime.settings, runtime.edge)
    return Component(
        name="keys",
        router=router(service, runtime.edge, runtime.settings),
        subscribers=subscribers(service, runtime.broker, runtime.settings),
        migrations=Path(__file__).parent / "migrations",
        on_start=[service.relay.start],
        on_stop=[service.relay.stop],
    )
