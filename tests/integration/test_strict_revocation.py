"""(v3, issue #37 item 6) Disabling is strict across replicas: once a toggle (to disabled) or a
DELETE has answered, no replica admits the key, and no verify. Two platforms in this process
share Kafka, Postgres and Redis; B's keys.v1 follower is stopped (a replica cut off from Kafka),
so only the revocation A shared in Redis can refuse the key on B. A key enabled again is
admitted by B once B has that newer state (enabling may lag). (v4) The same holds for a PATCH that
narrows a key: no replica admits a call by the key's older, wider rules once the PATCH answered."""

import hashlib

import httpx
import pytest

from tests.integration.test_edge_verify import service_token
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.support.apps import running_app
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration
GEO = "/api/geo/projects"


async def test_a_replica_cut_off_from_kafka_refuses_a_key_the_moment_its_toggle_or_delete_answered(settings):
    async with running_app(settings) as (app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        _, owner = await signup(a)
        toggled, deleted = await new_key(a, owner), await new_key(a, owner)
        digests = [hashlib.sha256(k["key"].encode()).hexdigest() for k in (toggled, deleted)]

        async def b_knows_both() -> bool:
            return all(edge_b.keys.get(d) is not None for d in digests)

        await wait_until(b_knows_both, timeout=20, interval=0.02)
        verifier = bearer(await service_token(a, settings, ["keys:verify"]))
        await wait_until(lambda: _known_token(edge_b), timeout=20, interval=0.02)
        for key in (toggled, deleted):
            assert (await b.get(GEO, headers=bearer(key["key"]))).status_code == 200

        await edge_b._follower.stop()  # B hears nothing more from Kafka
        assert (await a.post(f"/api/api-keys/{toggled['id']}/toggle", headers=owner)).json()["status"] == "disabled"
        refused = await b.get(GEO, headers=bearer(toggled["key"]))
        assert (refused.status_code, code(refused)) == (401, "api_key_disabled")
        body = {"key": toggled["key"], "method": "POST", "path": "/v1/chat", "ip": "203.0.113.5"}
        answer = (await b.post("/api/edge/verify", json=body, headers=verifier)).json()
        assert (answer["valid"], answer["code"]) == (False, "api_key_disabled")

        assert (await a.delete(f"/api/api-keys/{deleted['id']}", headers=owner)).status_code == 204
        gone = await b.get(GEO, headers=bearer(deleted["key"]))
        assert (gone.status_code, code(gone)) == (401, "invalid_api_key")

        # Enabled again: B, still cut off, refuses until it has the newer state; then it admits.
        assert (await a.post(f"/api/api-keys/{toggled['id']}/toggle", headers=owner)).json()["status"] == "enabled"
        assert (await b.get(GEO, headers=bearer(toggled["key"]))).status_code == 401
        edge_b.keys.apply(app_a.state.runtime.edge.keys.get(digests[0]))  # what keys.v1 would bring
        assert (await b.get(GEO, headers=bearer(toggled["key"]))).status_code == 200


async def _known_token(edge: object) -> bool:
    return len(edge.service_tokens) > 0  # type: ignore[attr-defined]


async def test_every_replica_refuses_at_once_over_many_toggles(settings):
    """The race the issue measured (1 of 80 admitted): a call to another replica sent the moment
    each toggle answered. 0 admitted, with B following Kafka as usual."""
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        _, owner = await signup(a)
        key = await new_key(a, owner)
        digest = hashlib.sha256(key["key"].encode()).hexdigest()
        await wait_until(lambda: _knows(app_b.state.runtime.edge, digest), timeout=20, interval=0.02)
        admitted_after_disable = 0
        for _ in range(25):
            disabled = await a.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)
            assert disabled.json()["status"] == "disabled"
            if (await b.get(GEO, headers=bearer(key["key"]))).status_code == 200:
                admitted_after_disable += 1
            assert (await a.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)).json()["status"] == "enabled"
            await _admitted_again(b, key["key"])
        assert admitted_after_disable == 0


async def test_a_patch_that_narrows_a_key_is_in_force_on_a_replica_cut_off_from_kafka(settings):
    """(v4, #40) B still holds the key's older rules (any model), and hears nothing more: once A's
    PATCH to one model answered, B admits no call by the older rules (503, retry); with the new
    state it answers each model as the new rules say."""
    async with running_app(settings) as (app_a, a), running_app(settings) as (app_b, b):
        edge_b = app_b.state.runtime.edge
        _, owner = await signup(a)
        key = await new_key(a, owner)
        digest = hashlib.sha256(key["key"].encode()).hexdigest()
        await wait_until(lambda: _knows(edge_b, digest), timeout=20, interval=0.02)
        verifier = bearer(await service_token(a, settings, ["keys:verify"]))
        await wait_until(lambda: _known_token(edge_b), timeout=20, interval=0.02)

        async def verdict(model: str) -> str:
            body = {"key": key["key"], "method": "POST", "path": "/v1/chat", "ip": "203.0.113.5", "model": model}
            answer = await b.post("/api/edge/verify", json=body, headers=verifier)
            assert answer.status_code == 200, answer.text
            return "valid" if answer.json()["valid"] else str(answer.json()["code"])

        assert await verdict("openai/gpt-4o") == "valid"
        await edge_b._follower.stop()  # B hears nothing more from Kafka
        narrowed = await a.patch(f"/api/api-keys/{key['id']}", json={"allowed_models": ["openai/gpt-4o-mini"]}, headers=owner)
        assert narrowed.status_code == 200, narrowed.text
        assert await verdict("openai/gpt-4o") == "service_unavailable"  # not by the older, wider rules
        assert await verdict("openai/gpt-4o-mini") == "service_unavailable"  # nor any call: B must read them first
        refused = await b.get(GEO, headers=bearer(key["key"]))
        assert (refused.status_code, code(refused), refused.headers["retry-after"]) == (503, "service_unavailable", "1")

        edge_b.keys.apply(app_a.state.runtime.edge.keys.get(digest))  # what keys.v1 would bring
        assert await verdict("openai/gpt-4o") == "model_not_allowed"
        assert await verdict("openai/gpt-4o-mini") == "valid"


async def test_no_replica_admits_by_older_rules_over_many_patches(settings):
    """The toggle race, for rules: B follows Kafka as usual, and a call by a model the key has just
    lost is sent to B the moment each narrowing PATCH answered. 0 admitted."""
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        _, owner = await signup(a)
        key = await new_key(a, owner)
        digest = hashlib.sha256(key["key"].encode()).hexdigest()
        await wait_until(lambda: _knows(app_b.state.runtime.edge, digest), timeout=20, interval=0.02)
        verifier = bearer(await service_token(a, settings, ["keys:verify"]))
        await wait_until(lambda: _known_token(app_b.state.runtime.edge), timeout=20, interval=0.02)
        lost = {"key": key["key"], "method": "POST", "path": "/v1/chat", "ip": "203.0.113.5", "model": "openai/gpt-4o"}
        patch, widen, narrow = f"/api/api-keys/{key['id']}", {"allowed_models": None}, {"allowed_models": ["openai/gpt-4o-mini"]}
        admitted_after_narrowing = 0
        for _ in range(25):
            assert (await a.patch(patch, json=narrow, headers=owner)).status_code == 200
            if (await b.post("/api/edge/verify", json=lost, headers=verifier)).json()["valid"]:
                admitted_after_narrowing += 1
            assert (await a.patch(patch, json=widen, headers=owner)).status_code == 200

            async def admitted_again() -> bool:  # widening may lag: wait for B to have it
                return bool((await b.post("/api/edge/verify", json=lost, headers=verifier)).json()["valid"])

            await wait_until(admitted_again, timeout=10, interval=0.005)
        assert admitted_after_narrowing == 0


async def _knows(edge: object, digest: str) -> bool:
    return edge.keys.get(digest) is not None  # type: ignore[attr-defined]


async def _admitted_again(client: httpx.AsyncClient, secret: str) -> None:
    async def admitted() -> bool:
        return (await client.get(GEO, headers=bearer(secret))).status_code == 200

    await wait_until(admitted, timeout=10, interval=0.005)
