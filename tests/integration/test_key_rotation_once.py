"""A key is rotated once: in its grace period it already has its successor, and rotating it again
(one request after the other, or two at the same instant) is 409 `conflict`, never a second
permanent key of the same name and lineage. The successor is the one to rotate next."""

import asyncio

import httpx
import pytest

from tests.integration.test_keys_api import bearer, code, new_key, signup

pytestmark = pytest.mark.integration

HOUR = {"grace_seconds": 3600}


@pytest.fixture
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_client


async def rotate(client: httpx.AsyncClient, console: dict[str, str], key_id: str, body: dict[str, int]) -> httpx.Response:
    return await client.post(f"/api/api-keys/{key_id}/rotate", json=body, headers=console)


async def permanent_keys(client: httpx.AsyncClient, console: dict[str, str]) -> list[str]:
    """The ids of the account's listed keys that never expire."""
    listed = (await client.get("/api/api-keys", headers=console)).json()["items"]
    return [k["id"] for k in listed if k["expires_at"] is None]


async def test_a_key_in_its_grace_period_is_not_rotated_again(client):
    _, console = await signup(client)
    old = await new_key(client, console, name="prod")
    first = await rotate(client, console, old["id"], HOUR)
    assert first.status_code == 201, first.text
    successor = first.json()

    again = await rotate(client, console, old["id"], HOUR)
    assert (again.status_code, code(again)) == (409, "conflict"), again.text
    assert "already rotated" in again.json()["error"]["message"]
    assert await permanent_keys(client, console) == [successor["id"]]
    listed = {k["id"]: k for k in (await client.get("/api/api-keys", headers=console)).json()["items"]}
    assert set(listed) == {old["id"], successor["id"]}  # the old key's grace unchanged, no new key
    assert (listed[old["id"]]["rotated"], listed[successor["id"]]["rotated"]) == (True, False)
    assert (await client.get("/api/geo/projects", headers=bearer(old["key"]))).status_code == 200

    # the successor is the key to rotate: once more, one permanent key
    newest = await rotate(client, console, successor["id"], {"grace_seconds": 0})
    assert newest.status_code == 201, newest.text
    assert await permanent_keys(client, console) == [newest.json()["id"]]


async def test_two_rotations_of_one_key_at_the_same_instant_make_one_successor(client):
    _, console = await signup(client)
    keys = [await new_key(client, console, name=f"k{i}") for i in range(5)]
    # five pairs at once; the last pair mixes a grace with none (the loser finds the key deleted: 404)
    bodies = [(HOUR, HOUR)] * 4 + [(HOUR, {"grace_seconds": 0})]
    answers = await asyncio.gather(
        *(rotate(client, console, key["id"], body) for key, pair in zip(keys, bodies, strict=True) for body in pair)
    )
    pairs = [answers[i : i + 2] for i in range(0, len(answers), 2)]
    for pair in pairs[:4]:
        assert sorted(a.status_code for a in pair) == [201, 409], [a.text for a in pair]
    assert sorted(a.status_code for a in pairs[4]) in ([201, 404], [201, 409]), [a.text for a in pairs[4]]
    successors = {a.json()["id"] for a in answers if a.status_code == 201}
    assert len(successors) == 5
    assert set(await permanent_keys(client, console)) == successors  # one permanent key per lineage
