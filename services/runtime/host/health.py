"""/healthz (the process lives), /readyz (every dependency answers), /metrics (Prometheus)."""

import asyncio
import logging
from collections.abc import Mapping

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.edge.component import Check

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 2.0


async def _run(check: Check) -> bool:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
    except Exception:
        log.warning("readiness check failed", exc_info=True)
        return False


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
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return router
