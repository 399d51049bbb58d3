"""A dependency that is down becomes 503 service_unavailable with the contract's body.

Never a hang (pool and producer waits are bounded) and never a 500: the caller learns that it
may retry. `Retry-After` says when.
"""

import logging

import psycopg
from aiokafka.errors import KafkaError
from clickhouse_connect.driver.exceptions import OperationalError as ClickHouseUnreachable
from fastapi import FastAPI, Request
from fastapi.responses import Response

from contracts.errors import ErrorCode
from services.edge.errors import error_response
from services.runtime.platform.metrics import DEPENDENCY_ERRORS

log = logging.getLogger(__name__)
RETRY_AFTER_S = "2"


def install_unavailable_handlers(app: FastAPI) -> None:
    async def _down(request: Request, exc: Exception, dependency: str, metric: str) -> Response:
        log.warning("%s unavailable: %s", dependency, exc)
        DEPENDENCY_ERRORS.labels(metric).inc()
        return error_response(
            request,
            503,
            ErrorCode.SERVICE_UNAVAILABLE,
            f"A dependency ({dependency}) is unavailable; retry shortly.",
            headers={"Retry-After": RETRY_AFTER_S},
        )

    @app.exception_handler(psycopg.OperationalError)  # includes psycopg_pool.PoolTimeout
    async def _postgres(request: Request, exc: psycopg.OperationalError) -> Response:
        return await _down(request, exc, "database", "postgres")

    # Any Kafka error on the request path (timeout, lost connection, a producer fenced or out of
    # sequence after a broker restart) means the log did not take the write: retryable.
    @app.exception_handler(KafkaError)
    async def _kafka(request: Request, exc: KafkaError) -> Response:
        return await _down(request, exc, "event log", "kafka")

    # The analytics' store unreachable (refused, reset, timed out): a query it could not answer.
    # A query it refused (clickhouse_connect's other DatabaseErrors) is a bug, and stays a 500.
    @app.exception_handler(ClickHouseUnreachable)
    async def _clickhouse(request: Request, exc: ClickHouseUnreachable) -> Response:
        return await _down(request, exc, "analytics store", "clickhouse")
