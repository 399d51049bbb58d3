"""The idempotency window of POST /api/usage/events: accepted ids are forgotten after it.

The endpoint answers a re-sent id as a duplicate while `metering.ingested_events` holds it: at
least USAGE_IDEMPOTENCY_WINDOW_SECONDS, at most one prune interval more. After that the id is
accepted and published again, and the sink still drops it as the same event (same id, account
and hour; docs/clickhouse.md), as quota does (`quota.processed_events`).
"""

from services.edge.component import Runtime
from services.runtime.platform.pruner import Pruner


def ingested_events_pruner(runtime: Runtime) -> Pruner:
    settings = runtime.settings
    return Pruner(
        runtime.pool,
        "metering",
        "ingested_events",
        key="id",
        column="received_at",
        keep_s=settings.usage_idempotency_window_seconds,
        interval_s=settings.prune_interval_seconds,
    )
