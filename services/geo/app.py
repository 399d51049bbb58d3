"""Wiring of the geo service."""

from pathlib import Path

from services.edge import Component, Runtime
from services.geo.api import build_router, fast_routes
from services.geo.service import GeoService
from services.geo.store import GeoStore
from services.runtime.platform.outbox_relay import OutboxRelay


def build(runtime: Runtime) -> Component:
    relay = OutboxRelay(runtime.pool, runtime.settings, "geo")
    service = GeoService(GeoStore(runtime.pool), relay, runtime.edge.quota, runtime.clock, runtime.settings.console_url)
    return Component(
        name="geo",
        router=build_router(runtime, service),
        fast_routes=fast_routes(runtime, service),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start],
        on_stop=[relay.stop],
    )
