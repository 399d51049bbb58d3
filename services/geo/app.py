"""Wiring of the geo service."""

from pathlib import Path

from services.edge.component import Component, Runtime
from services.geo.api import router
from services.runtime.platform.outbox_relay import OutboxRelay


def build(runtime: Runtime) -> Component:
    relay = OutboxRelay(runtime.pool, runtime.settings, "geo")
    return Component(
        name="geo",
        router=router(runtime.pool, runtime.edge, relay),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start],
        on_stop=[relay.stop],
    )
