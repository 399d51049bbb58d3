"""Hostile HTTP input is bounded and answered with a 4xx in the contract's body, never a 5xx."""

import httpx
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Stateless HTTP checks: one platform for the module (conftest.module_client)."""
    return module_client


def _is_contract_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code and body["message"] and body["request_id"] == response.headers["X-Request-ID"]


async def test_an_oversized_body_is_refused_with_413(client):
    response = await client.post(
        "/api/usage/events", content=b"{" + b" " * (3 * 1024 * 1024) + b"}", headers={"content-type": "application/json"}
    )
    _is_contract_error(response, 413, "payload_too_large")


async def test_an_oversized_chunked_body_is_refused_with_413(client):
    async def chunks():
        for _ in range(40):
            yield b"x" * (100 * 1024)

    response = await client.post("/api/auth/login", content=chunks(), headers={"content-type": "application/json"})
    _is_contract_error(response, 413, "payload_too_large")


async def test_a_lying_content_length_is_refused(client):
    response = await client.post("/api/auth/login", content=b"{}", headers={"content-length": "not-a-number"})
    assert 400 <= response.status_code < 500


async def test_missing_credentials_everywhere_use_the_contract_body(client):
    for path in ("/api/account", "/api/api-keys", "/api/ai/usage/overview", "/api/billing/check-quota", "/api/notifications"):
        response = await client.get(path)
        if response.status_code == 404:
            continue  # not mounted yet in this tree
        _is_contract_error(response, 401, "missing_credentials")
