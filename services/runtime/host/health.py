"""/healthz (the process lives), /readyz (every dependency answers), /metrics (Prometheus)."""

import asyncio
import logging
import os
from collections.abc import Mapping

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from psycopg_pool import AsyncConnectionPool

from services.edge.component import Check
from services.edge.edge import Edge
from services.runtime.platform.cluster import ClusterReader
from services.runtime.platform.metrics import DEPENDENCIES, DEPENDENCY_UP
from services.runtime.platform.periodic import Periodic

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 2.0


async def _run(check: Check) -> bool:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
    except Exception:
        log.warning("readiness check failed", exc_info=True)
        return False


def platform_checks(cluster: ClusterReader, topic: str, pool: AsyncConnectionPool, edge: Edge) -> dict[str, Check]:
    """What every process needs: Kafka (it answers about `topic`, one of Tollgate's), Postgres,
    and the edge's projections caught up."""

    async def kafka() -> bool:
        return await cluster.answers(topic)

    async def postgres() -> bool:
        async with pool.connection(timeout=CHECK_TIMEOUT_S) as conn:
            await conn.execute("SELECT 1")
        return True

    async def edge_ready() -> bool:
        return edge.is_ready()

    return {"kafka": kafka, "postgres": postgres, "edge": edge_ready}


class DependencyProbe:
    """Runs the readiness checks of the dependencies every `interval_s` and sets
    `tollgate_dependency_up`: an alert sees a dependency down even when no request needs it."""

    def __init__(self, checks: Mapping[str, Check], interval_s: float) -> None:
        self._checks = {name: check for name, check in checks.items() if name in DEPENDENCIES}
        self._periodic = Periodic("dependency-probe", interval_s, self.probe, what="probing dependencies", log=log)

    async def start(self) -> None:
        await self.probe()
        await self._periodic.start()

    async def close(self) -> None:
        await self._periodic.stop()

    async def probe(self) -> None:
        names = list(self._checks)
        results = await asyncio.gather(*(_run(self._checks[n]) for n in names))
        for name, ok in zip(names, results, strict=True):
            DEPENDENCY_UP.labels(name).set(1 if ok else 0)


def health_router(checks: Mapping[str, Check]) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        names = list(checks)
        results = await asyncio.gather(*(_run(checks[n]) for n in names))
        status = {n: ("ready" if ok else "unavailable") for n, ok in zip(names, results, strict=True)}
        ready = all(results)
        return JSONResponse({"status": "ready" if ready else "unavailable", "checks": status}, status_code=200 if ready else 503)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(_exposition(), media_type=CONTENT_TYPE_LATEST)

    return router


def _exposition() -> bytes:
    """This process's metrics, or with `serve --workers N` every worker's, added up (prometheus
    client's multiprocess mode: each worker writes its values to files in that folder)."""
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return generate_latest()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)
