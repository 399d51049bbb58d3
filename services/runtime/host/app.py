"""Builds one FastAPI process that mounts the services a `--target` names (Loki-style)."""

import asyncio
import gc
import importlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from contracts.topics import KEYS
from services.console import router as console_router
from services.edge.body_limit import BodyLimitMiddleware
from services.edge.component import Component, Overrides, Runtime
from services.edge.data_errors import install_data_error_handler
from services.edge.edge import Edge
from services.edge.errors import ERROR_RESPONSES, install_error_handlers
from services.edge.fast_routes import install as install_fast_routes
from services.edge.middleware import RequestMiddleware
from services.edge.openapi_security import install as install_openapi_security
from services.edge.screen import RefusalScreen
from services.edge.unavailable import install_unavailable_handlers
from services.edge.verify_api import build_router as verify_router
from services.edge.verify_fast import install as install_verify_fast_path
from services.runtime.host.health import DependencyProbe, health_router, platform_checks
from services.runtime.host.routing import remember_routes
from services.runtime.platform import postgres
from services.runtime.platform.cluster import ClusterReader
from services.runtime.platform.consumer_lag import ConsumerLag
from services.runtime.platform.kafka import ensure_topics, make_broker, start_subscribers
from services.runtime.platform.metrics import ProcessStats
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.settings import Settings, get_settings

log = logging.getLogger(__name__)
SERVICES: tuple[str, ...] = ("keys", "billing", "quota", "metering", "alerts", "geo")
METRICS_INTERVAL_S = 5.0  # how often a process refreshes its CPU and memory, and probes its dependencies


def expand_targets(targets: Sequence[str]) -> list[str]:
    names: list[str] = []
    for target in targets:
        for name in SERVICES if target == "all" else target.split(","):
            if name not in SERVICES:
                raise ValueError(f"unknown target {name!r}; choose from all, {', '.join(SERVICES)}")
            if name not in names:
                names.append(name)
    return names


def create_app(
    targets: Sequence[str] = ("all",),
    settings: Settings | None = None,
    overrides: Overrides | None = None,
    *,
    consumers: bool = True,
) -> FastAPI:
    """The targets' routes, projections and periodic work; their consumers too unless `consumers`
    is False (`serve --workers N` runs them in a process of their own: services/runtime/host/workers.py)."""
    settings = settings or get_settings()
    names = expand_targets(targets)
    broker = make_broker(settings)
    pool = postgres.open_pool(settings.database_url)
    edge = Edge(settings)
    runtime = Runtime(settings=settings, broker=broker, pool=pool, edge=edge, overrides=overrides or Overrides())
    components: list[Component] = [importlib.import_module(f"services.{n}.app").build(runtime) for n in names]
    cluster = ClusterReader(settings.kafka_bootstrap_servers)
    checks = platform_checks(cluster, settings.topic(KEYS.name), pool, edge)
    for component in components:
        checks.update(component.checks)
    stats = ProcessStats()
    process_stats = Periodic("process-stats", METRICS_INTERVAL_S, stats.refresh_async, what="reading CPU and memory", log=log)
    loops = [loop for component in components for loop in component.consumers] if consumers else []
    if consumers:
        loops.append(ConsumerLag(settings))  # where the consumers run, how far behind their groups are
        loops.append(DependencyProbe(checks, METRICS_INTERVAL_S))  # and which dependencies answer
    for component in components:
        if consumers and component.subscribers is not None:
            broker.include_router(component.subscribers)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Side by side: each service migrates a schema of its own under a lock of its own, and the
        # topics are Kafka's (one after the other, they were a tenth of a process's start).
        await asyncio.gather(
            *(
                asyncio.to_thread(postgres.apply_migrations, settings.database_url, component.name, component.migrations)
                for component in components
                if component.migrations is not None
            ),
            ensure_topics(settings),
        )
        await pool.open(wait=True, timeout=30)
        await broker.connect()
        await edge.start()
        for component in components:
            for hook in component.on_start:
                await hook()
        for loop in loops:
            await loop.start()
        stats.refresh()
        await process_stats.start()
        await start_subscribers(broker)
        # Everything built so far lives as long as the process: keep it out of the collector's
        # full passes, whose pauses showed in the analytics queries' tail (BENCHMARKS.md, "metering").
        gc.freeze()
        try:
            yield
        finally:
            await process_stats.stop()
            for loop in loops:
                await loop.close()
            await broker.stop()
            for component in reversed(components):
                for hook in reversed(component.on_stop):
                    await hook()
            await edge.stop()
            await cluster.close()
            await pool.close()

    app = FastAPI(
        title="Tollgate",
        version="1.0.0",
        description="API keys, usage metering, quotas and usage alerts. Contract: docs/api.md.",
        lifespan=lifespan,
        # Tollgate's metrics are Prometheus (/metrics). FastAPI's native OpenTelemetry asks the OTel
        # API for its providers on every request (three environment reads) even when none is
        # configured: ~5 us of each request's ~45 us in process (BENCHMARKS.md, "The refusal paths in process").
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.runtime = runtime
    app.state.components = components
    install_error_handlers(app)
    install_unavailable_handlers(app)
    install_data_error_handler(app)
    app.add_middleware(RefusalScreen, edge=edge)  # inside the two below: context and 413 first
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(RequestMiddleware)  # outermost: every response, even a 413, has an id

    app.include_router(health_router(checks))
    for component in components:
        if component.router is not None:
            app.include_router(component.router, responses=ERROR_RESPONSES)
    # Every process decides for services outside Tollgate too: verify and authorize need only the edge.
    app.include_router(verify_router(edge), responses=ERROR_RESPONSES)
    app.include_router(console_router())  # every mode serves the console; it calls only the public API
    install_openapi_security(app)
    remember_routes(app)
    install_fast_routes(app, [route for component in components for route in component.fast_routes])
    install_verify_fast_path(app, edge)  # verify's hot case skips the router (issue 38, decision 5)
    return app
