"""Rotating a key replaces its secret, not whom it acts as: an owner who rotates a developer's key
hands back a key that still acts with the developer's role (verify and authorize pass that role
upstream as X-Tollgate-Role) and that the developer can still toggle, rotate and delete."""

import httpx
import pytest

from tests.integration.test_keys_api import bearer, new_key, signup
from tests.integration.test_members import add, login

pytestmark = pytest.mark.integration


@pytest.fixture
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_client


async def test_an_owners_rotation_of_a_developers_key_keeps_the_developers_role(client):
    _, owner = await signup(client)
    developer = await add(client, owner, "developer")
    dev = await login(client, developer["email"])
    key = await new_key(client, dev)
    before = await client.get("/api/account", headers=bearer(key["key"]))
    assert before.json()["role"] == "developer", before.text

    rotated = await client.post(f"/api/api-keys/{key['id']}/rotate", json={"grace_seconds": 0}, headers=owner)
    assert rotated.status_code == 201, rotated.text
    after = await client.get("/api/account", headers=bearer(rotated.json()["key"]))
    assert after.json()["role"] == "developer", after.text  # not the rotating owner's
    toggled = await client.post(f"/api/api-keys/{rotated.json()['id']}/toggle", headers=dev)
    assert toggled.status_code == 200, toggled.text  # still the developer's own key
