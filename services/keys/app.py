"""Wiring of the keys service."""

from pathlib import Path

from services.edge import Component, Runtime
from services.keys import api, consumers
from services.keys.delivery import EdgeDelivery
from services.keys.service import KeysService
from services.keys.store import KeysStore
from services.runtime.platform.outbox_relay import OutboxRelay


def build(runtime: Runtime) -> Component:
    async def tick() -> None:
        await service.tick()

    relay = OutboxRelay(runtime.pool, runtime.settings, "keys", on_tick=tick)
    service = KeysService(
        KeysStore(runtime.pool, relay),
        EdgeDelivery(relay, runtime.edge, runtime.clock),
        runtime.clock,
        session_ttl_seconds=runtime.settings.session_ttl_seconds,
    )
    return Component(
        name="keys",
        router=api.build_router(runtime, service),
        subscribers=consumers.build_router(service, runtime.broker, runtime.settings),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start],
        on_stop=[relay.stop],
    )
