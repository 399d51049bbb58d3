"""A dependency that fails on the request path answers 503 with the contract's body, not 500."""

import psycopg
import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, OutOfOrderSequenceNumber
from fastapi import FastAPI
from fastapi.testclient import TestClient
from psycopg_pool import PoolTimeout

from services.edge.errors import install_error_handlers
from services.edge.middleware import RequestMiddleware
from services.edge.unavailable import install_unavailable_handlers


@pytest.mark.parametrize(
    "error",
    [
        KafkaTimeoutError(),
        KafkaConnectionError("refused"),
        OutOfOrderSequenceNumber(),
        PoolTimeout("no connection"),
        psycopg.OperationalError("server closed the connection"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_failing_dependency_is_a_retryable_503(error):
    app = FastAPI()
    install_error_handlers(app)
    install_unavailable_handlers(app)
    app.add_middleware(RequestMiddleware)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    response = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert response.status_code == 503
    assert response.headers["Retry-After"]
    body = response.json()["error"]
    assert body["code"] == "service_unavailable" and body["request_id"] == response.headers["X-Request-ID"]
