"""Wiring of the keys service."""

import logging
from pathlib import Path

from contracts.topics import SESSIONS_RETENTION_S, STATE_OWNERS
from services.edge import Component, Runtime
from services.keys import api, consumers
from services.keys.delivery import EdgeDelivery
from services.keys.failover_logs import attempt_logs
from services.keys.service import SERVICE_TOKEN_USES_EVERY_S, KeysService
from services.keys.store import KeysStore
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.pruner import Pruner
from services.runtime.platform.state_guard import StateGuard

# Rotated keys past their grace are deleted within this (the edge refuses them from the exact
# instant on anyway: their state carries the expiry); service tokens' uses are written as often.
TICK_S = SERVICE_TOKEN_USES_EVERY_S

log = logging.getLogger(__name__)


def build(runtime: Runtime) -> Component:
    relay = OutboxRelay(runtime.pool, runtime.settings, "keys")
    service = KeysService(
        KeysStore(runtime.pool, relay),
        EdgeDelivery(relay, runtime.edge, runtime.clock),
        runtime.clock,
        session_ttl_seconds=runtime.settings.session_ttl_seconds,
    )
    # The login and sign-up throttles' logs: shared by the replicas through Redis (REDIS_URL).
    attempts = attempt_logs(runtime.settings)
    ticks = Periodic("keys:tick", TICK_S, service.tick, what="the keys' periodic work", log=log)
    # Logouts are kept as long as sessions.v1 keeps them (no session outlives that: settings).
    logouts = Pruner(
        runtime.pool,
        "keys",
        "session_revocations",
        key="id",
        column="revoked_at",
        keep_s=SESSIONS_RETENTION_S,
        interval_s=runtime.settings.prune_interval_seconds,
    )
    # Kafka lost the keys' states: given again from Postgres (docs/architecture.md, "Kafka is transport")
    guard = StateGuard(
        runtime.settings,
        runtime.pool,
        runtime.broker,
        "keys",
        STATE_OWNERS["keys"],
        service.held_states,
        service.republish,
        hold=runtime.edge.rebuilding,
    )
    return Component(
        name="keys",
        router=api.build_router(runtime, service, attempts),
        subscribers=consumers.build_router(service, runtime.broker, runtime.settings),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start, guard.start, ticks.start, logouts.start],
        on_stop=[logouts.stop, ticks.stop, guard.stop, relay.stop, attempts.close],
    )
