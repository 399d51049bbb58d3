"""Wiring of the metering service: ingest (the endpoint and the sink), analytics, the ClickHouse
schema, the idempotency window."""

import asyncio
from pathlib import Path

from contracts.topics import KEYS
from services.edge import Component, Runtime
from services.metering import prices
from services.metering.analytics import Analytics
from services.metering.api import build_router
from services.metering.consumers import Sink
from services.metering.ingest import Ingest
from services.metering.keymasks import KeyMasks
from services.metering.store import IngestedIds, MeteringStore
from services.metering.usage_topic import UsageTopic
from services.runtime.platform.pruner import Pruner
from services.runtime.platform.topic_follower import TopicFollower


def build(runtime: Runtime) -> Component:
    settings = runtime.settings
    store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    masks = KeyMasks()
    follower = TopicFollower(settings.kafka_bootstrap_servers, {settings.topic(KEYS.name): masks.apply})
    price_table = prices.load(settings.metering_prices_file)
    ingest = Ingest(IngestedIds(runtime.pool), UsageTopic(runtime).publish, runtime.clock)
    analytics = Analytics(store, price_table, masks.mask, runtime.clock, settings.platform_timezone, masks.keys_of)
    sink = Sink(runtime, store, masks.allowed_models, follower.caught_up.wait)
    window = Pruner(  # forgets the idempotency window's ids (store.IngestedIds)
        runtime.pool,
        "metering",
        "ingested_events",
        key="id",
        column="received_at",
        keep_s=settings.usage_idempotency_window_seconds,
        interval_s=settings.prune_interval_seconds,
    )

    async def start() -> None:
        await asyncio.to_thread(store.open)  # connect and apply the ClickHouse DDL
        await store.publish_prices(price_table)  # for analysts (docs/analysts.md)
        await follower.start()

    async def stop() -> None:
        await follower.stop()
        await asyncio.to_thread(store.close)

    return Component(
        name="metering",
        router=build_router(runtime, ingest, analytics),
        migrations=Path(__file__).with_name("migrations"),
        consumers=[sink],
        on_start=[start, window.start],
        on_stop=[stop, window.stop],
        checks={"clickhouse": store.ping},
    )
